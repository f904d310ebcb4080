"""gpu_check.py's training-setup section: train.compile, FSDP2 and activation checkpointing on one GPU.

- compile: gpt2-small under varlen in bf16 on bestfit batches of four different token counts, eager
  against `pretrain.model.compile.compile_blocks` (inductor): the first step's loss (same weights),
  graphs compiled, recompiles after the first step (0 expected: T is dynamic, attention outside the
  graphs), compile seconds, ms per step and the speed-up.
- fsdp: a 2-layer GPT-2-width model, `fully_shard` per block then the root on a 1-rank NCCL group
  (what trainer=fsdp does per rank), three AdamW steps in fp32 against the plain model.
  The same against `compile_model` (train.compile_scope=model: the whole trunk as one graph).
- activation checkpointing: gpt2-small one step with and without, peak memory and ms per step.
- memory: where the peak of one gpt2-small step goes, per loss kernel (liger, chunked): the static state,
  the activations' share and the head and loss's share (the peak with them minus without).

Torch and numpy only, like gpu_check.py; every number is a row in the JSON, every check a Report check.
"""

from __future__ import annotations

import os
import time

import torch

TOL_COMPILE_LOSS = 1e-2  # |compiled - eager| / eager, bf16 (different fusions round differently)
TOL_FSDP_LOSS = 1e-5  # |sharded - plain| / plain over three fp32 AdamW steps on one rank


def _timed_steps(model, batches, steps: int, optimizer) -> tuple[float, list[float]]:
    """ms per training step (forward, backward, AdamW) over `steps` steps cycling through `batches`,
    and the losses."""
    losses = []
    torch.cuda.synchronize()
    started = time.perf_counter()
    for i in range(steps):
        batch = batches[i % len(batches)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model.loss(batch, batch.num_targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss))
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - started) / steps, losses


def _gpt2_small(device, capacity: int, size: dict, loss_kernel: str = "auto"):
    """gpt2-small as a run builds it: the vocabulary padded to 50,304, train.loss_kernel resolved."""
    from pretrain.data.tokens import GPT2_VOCAB_SIZE
    from pretrain.model import GPT, GPTConfig
    from pretrain.model.fused_loss import resolve_loss_kernel

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=GPT2_VOCAB_SIZE, max_seq_len=capacity, vocab_multiple=64, **size)
    model = GPT(config, attn="varlen").to(device)
    model.loss_kernel = resolve_loss_kernel(loss_kernel, device)[0]
    return model


def _bestfit_batches(device, capacity: int, rows: int, sizes=(0, 2, 4, 6)):
    """Bestfit-like batches of `rows - k` packs for k in `sizes`: four token counts, four structures."""
    from synthetic import packed_batches, synthetic_chunks

    split, table = synthetic_chunks(int(rows * capacity / 500), capacity, seed=2)
    return [packed_batches(split, table, capacity, rows - k)[0].to(device) for k in sizes]


def compile_rows(report, device, size: dict, capacity: int, rows: int, steps: int) -> dict:
    """Eager vs compiled gpt2-small (varlen, bf16) on changing bestfit batches; see the module doc."""
    from pretrain.model.compile import compile_blocks, compile_model

    print("compile: gpt2-small, varlen, bf16, bestfit batches of 4 token counts", flush=True)
    batches = _bestfit_batches(device, capacity, rows)
    eager = _gpt2_small(device, capacity, size)
    model = _gpt2_small(device, capacity, size)
    model.load_state_dict(eager.state_dict())
    stats = compile_blocks(model)
    adam = {"lr": 1e-5, "fused": True}
    eager_opt = torch.optim.AdamW(eager.parameters(), **adam)
    compiled_opt = torch.optim.AdamW(model.parameters(), **adam)
    _, (eager_first,) = _timed_steps(eager, batches[:1], 1, eager_opt)
    first_ms, (compiled_first,) = _timed_steps(model, batches[:1], 1, compiled_opt)
    stats.first_step_done()
    report.check(
        "first loss vs eager: rel",
        "compile",
        abs(compiled_first - eager_first) / eager_first,
        TOL_COMPILE_LOSS,
    )
    _timed_steps(model, batches, len(batches), compiled_opt)  # every structure once more
    _timed_steps(eager, batches, len(batches), eager_opt)
    eager_ms, _ = _timed_steps(eager, batches, steps, eager_opt)
    compiled_ms, _ = _timed_steps(model, batches, steps, compiled_opt)
    report.check("recompiles after the first step", "compile", float(stats.recompiles), 0.0)
    row = {
        "tokens_per_batch": [b.num_tokens for b in batches],
        **stats.as_dict(),
        "first_step_ms": first_ms,
        "eager_ms_per_step": eager_ms,
        "compiled_ms_per_step": compiled_ms,
        "speedup": eager_ms / compiled_ms,
        # Steps after which compiling has paid for its first step (None: compiled is not faster).
        "breakeven_steps": (first_ms - eager_ms) / (eager_ms - compiled_ms)
        if compiled_ms < eager_ms
        else None,
    }
    del model, compiled_opt
    torch.cuda.empty_cache()
    # train.compile_scope=model: the whole trunk as one graph (varlen inside it, its bound static).
    whole = _gpt2_small(device, capacity, size)
    whole.load_state_dict(eager.state_dict())
    whole_stats = compile_model(whole)
    whole_opt = torch.optim.AdamW(whole.parameters(), **adam)
    whole_first_ms, (whole_first,) = _timed_steps(whole, batches[:1], 1, whole_opt)
    whole_stats.first_step_done()
    report.check(
        "whole trunk: first loss vs eager: rel",
        "compile",
        abs(whole_first - eager_first) / eager_first,
        TOL_COMPILE_LOSS,
    )
    _timed_steps(whole, batches, len(batches), whole_opt)
    whole_ms, _ = _timed_steps(whole, batches, steps, whole_opt)
    report.check(
        "whole trunk: recompiles after the first step", "compile", float(whole_stats.recompiles), 0.0
    )
    row["whole_trunk"] = {
        **whole_stats.as_dict(),
        "first_step_ms": whole_first_ms,
        "ms_per_step": whole_ms,
        "speedup_vs_eager": eager_ms / whole_ms,
        "speedup_vs_blocks": compiled_ms / whole_ms,
    }
    print("  " + ", ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    del eager, whole, eager_opt, whole_opt
    torch.cuda.empty_cache()
    return row


def fsdp_rows(report, device, d_model: int = 768, width: int = 1024) -> dict:
    """fully_shard per block then the root on a 1-rank NCCL group against the plain model, fp32."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    from pretrain.data.tokens import GPT2_VOCAB_SIZE
    from pretrain.model import GPT, GPTConfig

    print("fsdp: fully_shard on one GPU (1-rank NCCL group) vs the plain model, fp32", flush=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    started_group = not dist.is_initialized()
    if started_group:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        config = GPTConfig(
            vocab_size=GPT2_VOCAB_SIZE, n_layer=2, n_head=d_model // 64, d_model=d_model, max_seq_len=width
        )
        plain, sharded = GPT(config, attn="sdpa").to(device), GPT(config, attn="sdpa").to(device)
        sharded.load_state_dict(plain.state_dict())
        mesh = init_device_mesh(device.type, (1,))
        for block in sharded.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        register_fsdp_forward_method(sharded, "token_losses")
        batch = _bestfit_batches(device, width, 4, sizes=(0,))[0]
        losses = {}
        for name, model in (("plain", plain), ("sharded", sharded)):
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            losses[name] = []
            for _ in range(3):
                loss = model.token_losses(batch).sum() / batch.num_targets
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses[name].append(float(loss))
        gap = max(abs(a - b) / a for a, b in zip(losses["plain"], losses["sharded"], strict=True))
        report.check("3 AdamW steps vs plain model: max rel loss", "fsdp", gap, TOL_FSDP_LOSS)
        print(f"  losses {losses}", flush=True)
        return {"losses": losses, "max_rel_gap": gap}
    finally:
        if started_group:
            dist.destroy_process_group()


def activation_checkpointing_rows(device, size: dict, capacity: int, rows: int) -> list[dict]:
    """One gpt2-small step (varlen, bf16) with and without per-block recomputation: peak GiB, ms."""
    from pretrain.model.activation_checkpointing import apply_activation_checkpointing

    print("activation checkpointing: gpt2-small, varlen, bf16, one bestfit batch", flush=True)
    batch = _bestfit_batches(device, capacity, rows, sizes=(0,))
    results = []
    for recompute in (False, True):
        model = _gpt2_small(device, capacity, size)
        if recompute:
            apply_activation_checkpointing(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
        _timed_steps(model, batch, 1, optimizer)  # the optimizer state exists before the peak is read
        torch.cuda.reset_peak_memory_stats()
        ms, losses = _timed_steps(model, batch, 3, optimizer)
        row = {
            "activation_checkpointing": recompute,
            "ms_per_step": ms,
            "loss": losses[0],
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        }
        print("  " + ", ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        results.append(row)
        del model, optimizer
        torch.cuda.empty_cache()
    return results


def _peak_gib(model, batch, optimizer, head: bool) -> float:
    """Peak GiB of one training step; without the head the loss is a stand-in on the hidden states
    (same backward through the trunk, no vocabulary-sized work)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        if head:
            loss = model.loss(batch, batch.num_targets)
        else:
            loss = model.hidden_states(batch).float().square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**30


def memory_rows(device, size: dict, capacity: int, rows: int) -> list[dict]:
    """Where the peak of a gpt2-small step at rows x capacity goes, per loss kernel: the static state
    (parameters, AdamW moments), the activations' share (peak without the head, minus the static
    state) and the head and loss's share (peak with them minus without)."""
    print("memory: gpt2-small, varlen, bf16, one bestfit batch, per loss kernel", flush=True)
    batch = _bestfit_batches(device, capacity, rows, sizes=(0,))[0]
    results = []
    for kernel in ("liger", "chunked"):
        model = _gpt2_small(device, capacity, size, loss_kernel=kernel)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
        _peak_gib(model, batch, optimizer, head=True)  # the optimizer state exists from here on
        static = torch.cuda.memory_allocated() / 2**30
        with_head = _peak_gib(model, batch, optimizer, head=True)
        without_head = _peak_gib(model, batch, optimizer, head=False)
        row = {
            "loss_kernel": model.loss_kernel,
            "tokens": batch.num_tokens,
            "static_gib": static,
            "peak_gib": with_head,
            "activations_gib": without_head - static,
            "head_and_loss_gib": with_head - without_head,
        }
        print("  " + ", ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        results.append(row)
        del model, optimizer
        torch.cuda.empty_cache()
    return results


def training_setup_rows(report, device, size: dict, capacity: int, rows: int, steps: int) -> dict:
    """The three sections, each guarded: a failure is a failed check and a row, not a crash."""
    out: dict = {}
    sections = {
        "compile": lambda: compile_rows(report, device, size, capacity, rows, steps),
        "fsdp": lambda: fsdp_rows(report, device),
        "activation_checkpointing": lambda: activation_checkpointing_rows(device, size, capacity, rows),
        "memory": lambda: memory_rows(device, size, capacity, rows),
    }
    for name, run in sections.items():
        try:
            out[name] = run()
        except Exception as error:  # a row and a failed check, then the next section
            message = f"{type(error).__name__}: {error}".splitlines()[0][:400]
            report.fail(name, name, message)
            out[name] = {"error": message}
            torch.cuda.empty_cache()
    return out
