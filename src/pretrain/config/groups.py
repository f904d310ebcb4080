"""The schema's groups but the root, `train` and the plug-in groups (whose dataclasses live with their
plug-ins): tokenizer, split, budget, mixture, cache, prepare, model, trainer, logger. One dataclass
per group, one doc line per field, every range check once (`__post_init__`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from omegaconf import II, MISSING

from ..data.ingest.prepare_settings import Encoder
from ..data.ingest.writer import TokenDtype
from ..data.sources import typed_source
from ..errors import ConfigError
from .checks import ReadBy, _at_least, _is_set, _valid_devices


class TokenizerSource(StrEnum):
    bundled = "bundled"
    hub = "hub"
    files = "files"
    file = "file"  # any Hugging Face fast tokenizer: a local tokenizer.json (data/ingest/tokenizer_json.py)
    hub_file = "hub_file"  # a hub repository's tokenizer.json at the pinned revision


class VerifyMode(StrEnum):
    quick = "quick"
    full = "full"


class LoggerKind(StrEnum):
    csv = "csv"
    wandb = "wandb"


@dataclass
class TokenizerConfig:
    name: str = MISSING
    """hub repository of the tokenizer (source=hub; recorded in the cache identity)"""
    revision: str = MISSING
    """pinned hub revision of the tokenizer files"""
    source: TokenizerSource = TokenizerSource.bundled
    """GPT-2: bundled (its files shipped offline), hub (the pinned revision) or files; any Hugging Face
    fast tokenizer: file (a local tokenizer.json) or hub_file (the repository's at the revision)"""
    vocab_file: str | None = None
    """source=files: encoder.json / vocab.json"""
    merges_file: str | None = None
    """source=files: vocab.bpe / merges.txt"""
    file: str | None = None
    """source=file: the tokenizer.json"""
    eos_token: str | None = None
    """source=file/hub_file: the EOS token's text; null = the one the files name"""

    # The keys only some sources read; set under another, they are refused (checks.check_read).
    read_by: ClassVar[ReadBy] = ReadBy(
        "source",
        {
            "vocab_file": ("files",),
            "merges_file": ("files",),
            "file": ("file",),
            "eos_token": ("file", "hub_file"),
        },
    )


# The split's defaults are the schema's; data/ingest/split.py reads them from here (config sits below data).
DEFAULT_SPLIT_SEED = 20261003
DEFAULT_VALIDATION_FRACTION = 0.05
DEFAULT_LEAK_WINDOW = 64  # data/leaks.py LEAK_WINDOW: what inspect-data counts


@dataclass
class SplitConfig:
    seed: int = DEFAULT_SPLIT_SEED
    """seed re-hashed with each document's sha256 to pick its split"""
    validation_fraction: float = DEFAULT_VALIDATION_FRACTION
    """share of documents that go to validation, in [0, 1); 0 = no validation (no val/loss)"""
    decontaminate: bool = False
    """drop from validation every document sharing a run of split.leak_window tokens with a train
    document (inspect-data's verbatim_leaks; part of the cache identity when true)"""
    leak_window: int = DEFAULT_LEAK_WINDOW
    """tokens a shared run must have to count as a leak (split.decontaminate)"""

    def __post_init__(self) -> None:
        if isinstance(self.leak_window, int) and self.leak_window < 1:
            raise ConfigError(
                f"split.leak_window={self.leak_window!r} must be a positive number of tokens: set e.g. "
                f"split.leak_window={DEFAULT_LEAK_WINDOW} (the run of tokens a leak shares)"
            )
        fraction = self.validation_fraction
        if _is_set(fraction) and not 0.0 <= fraction < 1.0:
            hint = "1 leaves no training documents" if fraction == 1 else "it is a share of the documents"
            raise ConfigError(
                f"split.validation_fraction={fraction!r} must be in [0, 1) ({hint}): "
                f"set e.g. split.validation_fraction={DEFAULT_VALIDATION_FRACTION} (0 = no validation)"
            )


@dataclass
class BudgetConfig:
    train_tokens: int | None = None
    """raw tokens collected for train (whole documents, in source order); null = the whole source"""
    validation_tokens: int | None = None
    """raw tokens collected for validation; null = the whole source"""

    def __post_init__(self) -> None:
        if isinstance(self.train_tokens, int) and self.train_tokens < 1:
            raise ConfigError(
                f"budget.train_tokens={self.train_tokens!r} collects no training data: set a positive "
                "number of tokens, or budget.train_tokens=null for the whole source"
            )
        _at_least("budget.validation_tokens", self.validation_tokens, 0)


@dataclass
class ComponentConfig:
    """One component of a mixture: its own source (and cache), its share of the training tokens."""

    weight: float = MISSING
    """its share of the real training tokens (> 0; the weights are normalised to sum to 1)"""
    max_repeat: int = 1
    """times its documents may be used per epoch of the mixture (>= 1)"""
    source: Any = None
    """the keys of a `source` option (kind, files, ...): the component's documents, typed by its kind"""
    budget: BudgetConfig | None = None
    """its own raw-token budget; null = the run's `budget` group"""

    # Fields typed by a plug-in group's chosen dataclass (their keys are checked against it).
    typed_fields: ClassVar[dict[str, str]] = {"source": "source"}


@dataclass
class MixtureConfig:
    """`mixture=<name>` (conf/mixture/*.yaml): corpora mixed by token share (data/batching/mixture.py)."""

    components: dict[str, ComponentConfig] = field(default_factory=dict)
    """component name -> its weight, max_repeat, source and optional budget"""

    def __post_init__(self) -> None:
        if not self.components:
            raise ConfigError("mixture.components is empty: name at least one component with a source")
        for name, component in self.components.items():
            key = f"mixture.components.{name}"
            if not name.replace("_", "").replace("-", "").isalnum():
                raise ConfigError(f"{key}: a component name is a metric name: use letters, digits, _ or -")
            weight = component.weight
            if not _is_set(weight) or isinstance(weight, bool) or not weight > 0:
                shown = f"{weight:g}" if isinstance(weight, int | float) else repr(weight)
                raise ConfigError(f"{key}.weight must be > 0, got {shown}")
            if not math.isfinite(weight):  # inf > 0: the shares would be inf/inf (arbitrary)
                raise ConfigError(f"{key}.weight must be a finite number > 0, got {weight:g}")
            repeat = component.max_repeat
            if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
                raise ConfigError(f"{key}.max_repeat must be an integer >= 1, got {repeat!r}")
            if component.source is None:
                raise ConfigError(f"{key}.source.kind is missing: give the keys of a source option")
            component.source = typed_source(component.source, f"{key}.source")


@dataclass
class CacheConfig:
    rebuild: bool = False
    """rebuild a cache that fails verification instead of stopping"""
    token_dtype: TokenDtype = TokenDtype.auto
    """tokens on disk: auto (uint16 when every tokenizer id is below 65,536), uint16, uint32 (identity)"""
    verify: VerifyMode = VerifyMode.quick
    """reuse check: quick (manifest, sizes, stats; re-hash what changed) or full (all sha256)"""
    carried: bool = False
    """the cache under cache_root was prepared on another machine and copied here: its source identity is
    read from its manifest, not from this machine's source (another Python or other packages name another
    pydocs/pkgdocs corpus); tokenizer, split, budget and dtype must still match; the files are verified"""


@dataclass
class PrepareConfig:
    num_proc: int | None = None
    """prepare worker processes; null = the usable cores (small local sources: one); the cache is the same"""
    encoder: Encoder = Encoder.auto
    """GPT-2 ids of document bodies: auto (tiktoken when it fits the files, else tokenizers); same ids"""
    tasks: int = 1
    """prepare the source as this many tasks (one per shard, e.g. SLURM jobs), then assemble their parts"""
    task: int | None = None
    """with tasks > 1: encode only this shard (0..tasks-1) into the staging dir; null = assemble the cache"""

    def __post_init__(self) -> None:
        _at_least("prepare.num_proc", self.num_proc, 1)
        _at_least("prepare.tasks", self.tasks, 1)
        task, tasks = self.task, self.tasks
        if isinstance(task, int) and isinstance(tasks, int) and not 0 <= task < tasks:
            raise ConfigError(f"prepare.task={task!r} must be in 0..{tasks - 1} (prepare.tasks={tasks})")


@dataclass
class EvalConfig:
    context: list[int] = field(default_factory=lambda: [1, 16, 128])
    """context use: the validation targets scored again with their context cut to blocks of k tokens of
    their own document (positions from 0), for each k here below data.max_seq_len; `[]`: off"""
    downstream: list[str] = field(default_factory=list)
    """`pretrain lm-eval` tasks scored on last.ckpt when training completes (rank 0; into run.json's
    `downstream`, docs/evaluation.md), e.g. [pretrain_cloze,pretrain_recall]; `[]`: none"""
    downstream_limit: int | None = None
    """at most this many examples per downstream task; null: every example written (up to 1,000)"""

    def __post_init__(self) -> None:
        self._check_downstream()
        if not _is_set(self.context):
            return
        bad = [k for k in self.context if isinstance(k, bool) or not isinstance(k, int) or k < 1]
        if bad:
            raise ConfigError(
                f"eval.context={list(self.context)!r}: every context length must be an integer >= 1 "
                "(e.g. eval.context=[1,16,128]; eval.context=[] turns context scoring off)"
            )

    def _check_downstream(self) -> None:
        if _is_set(self.downstream):
            bad = [name for name in self.downstream if not isinstance(name, str) or not name.strip()]
            if bad:
                raise ConfigError(
                    f"eval.downstream={list(self.downstream)!r}: every entry must be a task name, e.g. "
                    "eval.downstream=[pretrain_cloze,pretrain_recall] (eval.downstream=[] for none)"
                )
        if _is_set(self.downstream_limit):
            _at_least("eval.downstream_limit", self.downstream_limit, 1)


@dataclass
class ModelConfig:
    name: str = MISSING
    """the size's name (tiny, gpt2-small, gpt2-medium): a label, the sizes are the fields below"""
    n_layer: int = MISSING
    """transformer blocks"""
    n_head: int = MISSING
    """attention heads (d_model must be divisible by it)"""
    d_model: int = MISSING
    """residual width"""
    dropout: float = 0.0
    """embedding and residual dropout (attention has none: the kernels must be interchangeable)"""
    vocab_size: int | None = None
    """the ids the model predicts; null = the tokenizer's (GPT-2: 50257)"""
    vocab_multiple: int = 64
    """the embedding and head get vocab_size rounded up to a multiple of this many rows (50257 -> 50304:
    tile-friendly matmuls on GPUs); the extra ids are never predicted, exports keep vocab_size rows;
    1 = no padding"""
    bias: bool = True
    """biases in linear layers and LayerNorms (GPT-2 has them)"""
    max_seq_len: int = II("data.max_seq_len")
    """learned positions; follows data.max_seq_len"""
    init_from: str | None = None
    """a local Hugging Face GPT-2 directory (config.json + model.safetensors) to start training from"""
    extend_positions: bool = False
    """init_from: allow data.max_seq_len past its position table (extra positions start fresh)"""
    arch: str = "gpt2"
    """the architecture: gpt2 (learned positions, LayerNorm, GELU) or llama (RoPE, RMSNorm, SwiGLU)"""
    n_kv_head: int | None = None
    """llama: key/value heads for grouped-query attention (n_head must be a multiple); null = n_head"""
    d_ff: int | None = None
    """llama: the SwiGLU hidden width; null = 8/3 x d_model rounded up to a multiple of 64"""
    rope_theta: float = 10000.0
    """llama: the RoPE base"""
    norm_eps: float = 1e-5
    """llama: the RMSNorm epsilon"""
    tie_embeddings: bool = True
    """llama: share the token embedding with the output head (GPT-2 always does)"""

    def __post_init__(self) -> None:
        # The one place for the model's range errors (GPTConfig only asserts them as invariants).
        for key in ("n_layer", "n_head", "d_model"):
            _at_least(f"model.{key}", getattr(self, key), 1)
        if _is_set(self.d_model) and _is_set(self.n_head) and self.d_model % self.n_head:
            raise ConfigError(
                f"model.d_model={self.d_model} must be divisible by model.n_head={self.n_head}: "
                "each head gets d_model / n_head channels"
            )
        if _is_set(self.dropout) and not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout={self.dropout!r} must be in [0, 1)")
        self._check_architecture()
        if _is_set(self.vocab_size) and self.vocab_size is not None:
            _at_least("model.vocab_size", self.vocab_size, 1)
        _at_least("model.vocab_multiple", self.vocab_multiple, 1)

    def _check_architecture(self) -> None:
        """The options each architecture (model.arch) has; the other's are refused, not ignored."""
        if self.arch not in ("gpt2", "llama"):
            raise ConfigError(f"model.arch={self.arch!r} is not an architecture: use gpt2 or llama")
        if self.arch == "gpt2":
            if not self.tie_embeddings:
                raise ConfigError("model.tie_embeddings=false needs model.arch=llama: GPT-2 ties its head")
            llama_only = {"n_kv_head": None, "d_ff": None, "rope_theta": 10000.0, "norm_eps": 1e-5}
            changed = [key for key, default in llama_only.items() if getattr(self, key) != default]
            if changed:
                raise ConfigError(
                    f"model.{changed[0]} is a llama option (model.arch=gpt2 here): pick a model=llama-* size"
                )
            return
        if self.bias:
            raise ConfigError("model.bias=true: a llama model has no biases; set model.bias=false")
        if _is_set(self.n_head) and self.n_kv_head is not None:
            _at_least("model.n_kv_head", self.n_kv_head, 1)
            if self.n_head % self.n_kv_head:
                raise ConfigError(
                    f"model.n_head={self.n_head} must be a multiple of model.n_kv_head={self.n_kv_head}: "
                    "each key/value head serves n_head / n_kv_head query heads"
                )
        if self.d_ff is not None:
            _at_least("model.d_ff", self.d_ff, 1)
        if _is_set(self.d_model) and _is_set(self.n_head) and (self.d_model // self.n_head) % 2:
            raise ConfigError(
                f"model.d_model / model.n_head = {self.d_model // self.n_head} must be even: RoPE rotates "
                "channel pairs"
            )
        for key in ("rope_theta", "norm_eps"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"model.{key}={getattr(self, key)!r} must be > 0")


@dataclass
class TrainerConfig:
    accelerator: str = MISSING
    """Lightning accelerator: cpu, gpu or auto (a CUDA GPU when there is one, else the CPU)"""
    devices: Any = MISSING
    """Lightning devices: a count, -1 for all, or a list of indices"""
    num_nodes: int = 1
    """machines of a multi-node run"""
    strategy: str = MISSING
    """Lightning strategy: auto, ddp, fsdp (FSDP2: fully_shard per block, sharded checkpoints)"""
    precision: str = MISSING
    """Lightning precision: 32-true, bf16-mixed, 16-mixed or auto (bf16-mixed on a GPU, fp16 before
    Ampere; 32-true on the CPU)"""
    peak_tflops: float | None = None
    """one device's peak TFLOP/s for train/mfu; null = looked up for known GPUs (no MFU on CPU)"""

    def __post_init__(self) -> None:
        devices = self.devices
        valid = _valid_devices(devices)
        if _is_set(devices) and not valid:
            raise ConfigError(
                f"trainer.devices={devices!r} must be a count >= 1, -1 (all), auto or a list of device "
                "indices, e.g. trainer.devices=1"
            )
        _at_least("trainer.num_nodes", self.num_nodes, 1)
        if _is_set(self.peak_tflops) and self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ConfigError(f"trainer.peak_tflops={self.peak_tflops!r} must be > 0 (or null)")


@dataclass
class LoggerConfig:
    kind: LoggerKind = MISSING
    """csv (metrics.csv only) or wandb (metrics.csv and Weights & Biases)"""
    project: str = "pretrain"
    """W&B project"""
    entity: str | None = None
    """W&B entity (team or user); null = the key's default"""
    group: str | None = None
    """W&B group; null = the multirun's sweep directory, else experiment_name"""
    tags: list[str] = field(default_factory=list)
    """extra W&B tags (policy, attn and model are always added)"""
    mode: str | None = None
    """online, offline or disabled; null = offline without an API key"""

    def __post_init__(self) -> None:
        if self.mode not in (None, "online", "offline", "disabled") and _is_set(self.mode):
            raise ConfigError(f"logger.mode={self.mode!r} must be online, offline, disabled or null")


class TaskName(StrEnum):
    pretrain = "pretrain"
    sft = "sft"


class LossMaskChoice(StrEnum):
    """`task.loss_mask` (the one definition is data/ingest/chat.py's LossMask; the schema sits above data
    and repeats the names for Hydra's enum check)."""

    assistant = "assistant"
    completion = "completion"
    all = "all"


@dataclass
class TaskConfig:
    """The `task` group: what the documents are and which targets train (docs/sft.md)."""

    name: TaskName = TaskName.pretrain
    """pretrain (documents, every target trains) or sft (conversations with a loss mask)"""
    loss_mask: LossMaskChoice = LossMaskChoice.assistant
    """sft: which targets train: assistant (the replies), completion (from the first reply on) or all"""
    chat_template: str | None = None
    """sft: a .jinja file, `plain` (the bundled template) or null (the tokenizer's own, else plain)"""
