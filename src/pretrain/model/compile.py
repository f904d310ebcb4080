"""train.compile: torch.compile the transformer blocks without letting a batch's structure into a graph.

A packed batch has a new document structure every step (segment count and lengths, the sdpa bucket
plan, flex's block mask, varlen's max_seqlen). Compiling through attention specializes a graph on it
and recompiles nearly every step (measured: 11-13 recompiles in 2 steps, then a crash in the plan).
So each block is compiled as its two halves around attention (`before_attention`: norm, QKV, RoPE;
`after_attention`: output projection, residual, norm, MLP), whose inputs are (T, width) tensors with
T marked dynamic, and attention runs between them through its backend's own kernels (flash varlen,
compiled flex, batched sdpa). The halves hold every matmul and elementwise op of a block.

The compiled halves replace the methods on each block instance: parameter names, state dicts and
checkpoints are those of the eager model, so a compiled run resumes an eager checkpoint and back.

`train.compile_scope=model` compiles the whole trunk instead (embeddings, every block, the final norm:
one graph, so the compiler fuses across block boundaries and no block's call costs Python at run
time), with attention inside it as one kernel call on dynamic-size tensors (attention/in_graph.py): T
and the segment count are dynamic, the document structure never enters a guard. Only varlen's kernel
is such a call; `auto` takes the whole trunk for varlen without FSDP (whose hooks sit between the
blocks) and the halves otherwise. The loss stays outside: the fused liger kernel is one kernel already.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..attention_backends import AUTO
from ..errors import ConfigError
from .architectures import Decoder, blocks_of
from .attention.in_graph import check_in_graph

HALVES = ("before_attention", "after_attention")
BLOCKS, MODEL = "blocks", "model"
COMPILE_SCOPES = (AUTO, MODEL, BLOCKS)


def resolve_compile_scope(setting: str, attention: str, device: torch.device | str, sharded: bool) -> str:
    """train.compile_scope for a model whose attn.backend is `attention` on `device`: model or blocks."""
    if setting not in COMPILE_SCOPES:
        raise ConfigError(f"train.compile_scope={setting!r}: use one of {', '.join(COMPILE_SCOPES)}")
    varlen = attention == "varlen" or (attention == AUTO and torch.device(device).type == "cuda")
    if setting == MODEL and not varlen:
        check_in_graph(attention)  # raises: says to use blocks
    if setting != AUTO:
        return setting
    return MODEL if varlen and not sharded else BLOCKS


def compile_enabled(setting: bool | str, device: torch.device | str) -> bool:
    """train.compile: auto compiles on CUDA only (on CPU inductor's C++ build costs more than it saves
    on the tiny models CPU runs use); true or false as given."""
    if setting == AUTO:
        return torch.device(device).type == "cuda"
    return bool(setting)


@dataclass
class CompileStats:
    """Graphs compiled and the seconds spent compiling them (forward and backward)."""

    graphs: int = 0
    seconds: float = 0.0
    graphs_at_first_step: int | None = None  # set after the first training step

    def first_step_done(self) -> None:
        if self.graphs_at_first_step is None:
            self.graphs_at_first_step = self.graphs

    @property
    def recompiles(self) -> int | None:
        """Graphs compiled after the first training step (a new grad mode, a shape dynamic missed)."""
        return None if self.graphs_at_first_step is None else self.graphs - self.graphs_at_first_step

    def as_dict(self) -> dict:
        return {
            "graphs": self.graphs,
            "graphs_first_step": self.graphs_at_first_step,
            "recompiles": self.recompiles,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class _CountingBackend:
    """A dynamo backend (inductor by default) with every graph it is handed counted and timed. The time
    is inductor's lowering and code generation of the forward and of the backward AOTAutograd traces
    with it; dynamo's own tracing (well under a second per graph) is not in it."""

    name: str = "inductor"
    stats: CompileStats = field(default_factory=CompileStats)

    def __call__(self, graph: torch.fx.GraphModule, example_inputs):
        started = time.perf_counter()
        try:
            return torch._dynamo.lookup_backend(self.name)(graph, example_inputs)
        finally:
            self.stats.graphs += 1
            self.stats.seconds += time.perf_counter() - started


def _graph_input(arg):
    """A tensor argument with dimension 0 (T, the tokens) marked dynamic, so that a new token count
    never recompiles (nor does the first change of it: no automatic re-trace). A view is passed as a
    copy: its base would enter the graph's guards with a static shape (an attention output is a view
    for uniform rows and not for bucketed ones, which alone cost a recompile)."""
    if not isinstance(arg, torch.Tensor) or arg.dim() == 0:
        return arg
    if arg._base is not None:
        arg = arg.clone()
    torch._dynamo.mark_dynamic(arg, 0)
    return arg


def _dynamic_rows(function):
    """`function` called with its tensor arguments made graph inputs (_graph_input)."""

    def call(*args):
        return function(*(_graph_input(arg) for arg in args))

    return call


def compile_blocks(model: torch.nn.Module, backend: str = "inductor") -> CompileStats:
    """Compile the two halves of each of `model.blocks` in place with the dynamo `backend`; the
    returned stats fill as graphs are compiled (at the first calls). One graph per half serves every
    block of the same shape."""
    counting = _CountingBackend(backend)
    for block in blocks_of(model):
        for name in HALVES:
            compiled = torch.compile(getattr(block, name), backend=counting)
            setattr(block, name, _dynamic_rows(compiled))
    return counting.stats


def compile_model(model: Decoder, backend: str = "inductor") -> CompileStats:
    """Compile `model.graph_trunk` (embeddings to final norm, attention as one op) with T and the
    segment boundaries dynamic; the model's hidden_states calls it from now on."""
    counting = _CountingBackend(backend)
    model.compiled_trunk = _dynamic_rows(torch.compile(model.graph_trunk, backend=counting))
    return counting.stats


def compiled(model: torch.nn.Module) -> bool:
    """Whether compile_blocks or compile_model has compiled `model`."""
    if getattr(model, "compiled_trunk", None) is not None:
        return True
    return any(name in block.__dict__ for block in blocks_of(model) for name in HALVES)
