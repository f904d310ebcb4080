"""`make gpu-check`: the CPU suite's attention checks for the CUDA-only paths, then a throughput table.

   PYTHONPATH=src python3 scripts/gpu_check.py [--output bench/results/gpu_check.json]

0. The installed torch's varlen_attn takes `window_size=(-1, 0)` (torch >= 2.11; 2.9/2.10 had is_causal).
1. Attention level, varlen and compiled flex in bf16 (forward and backward) against the fp32 sdpa
   reference (itself checked against a naive per-segment softmax on CPU): packed == reference,
   packed == each segment alone, and changing one segment leaves the others unchanged.
2. Model level (2-layer GPT-2 width, bf16 autocast): loss and gradients vs the fp32 sdpa model,
   document isolation, padded policy == packed policy on untruncated documents.
3. gpt2-small at 35 x 4096 (bf16 autocast, forward + backward + AdamW): real tokens/s and MFU of bestfit
   packs and padded rows under sdpa, flex and varlen. MFU = pretrain.model.flops.training_flops of the
   real segment lengths (padded rows count their real tokens, not the pad width) / step time / the
   device's bf16 peak (pretrain.model.flops.peak_flops of torch.cuda.get_device_name(), or --peak-tflops).

Needs torch, numpy and this checkout's src/ only (no Hydra, omegaconf, yaml, datasets, wandb): it runs on
a bare GPU box. About 2-4 minutes on one H100/H200; throughput rows not started by --budget-s
(default 210 s from the start) are recorded as skipped, so the whole run stays under 5 minutes.
Writes JSON to --output (torch version, device, every check, every throughput row) and the same as
markdown tables beside it (.md), and exits 1 if a check fails.
Without CUDA it prints "skipped: no CUDA" and exits 0 (writing nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "bench") not in sys.path:  # bench/synthetic.py: the benchmarks' synthetic batches
    sys.path.insert(0, str(ROOT / "bench"))

# Stated tolerances. bf16 keeps 8 mantissa bits: rounding alone moves a value by up to 2^-9 of it
# (0.016 for |x| in [4, 8), which a unit-normal v reaches), so tensors are compared by relative norm
# ||x - ref|| / ||ref|| with a looser max-abs guard against isolated outliers.
TOL_ATTN_REL = 1e-2  # out, dq, dk, dv vs the fp32 reference (expected ~4e-3)
TOL_ATTN_MAX = 6e-2  # max |out - ref|
TOL_ALONE_REL = 1e-2  # packed vs segment alone, same backend and dtype (tiles shift with the offset)
TOL_ISOLATION_OUT = 1e-6  # max |out| change of the other segments after replacing one (bitwise expected)
TOL_ISOLATION_GRAD = 1e-2  # relative: flash backward accumulates dq with atomics, so not bitwise
TOL_MODEL_LOSS = 1e-2  # |loss - ref| / ref, bf16 autocast vs the fp32 sdpa model
TOL_MODEL_GRAD_COS = 0.99  # cosine between the flattened parameter gradients
TOL_MODEL_ISOLATION = 1e-6  # other documents' token losses after changing one (bitwise expected)
TOL_PADDED_PACKED_FP32 = 1e-4  # max |token loss padded - packed|, fp32 sdpa
TOL_PADDED_PACKED = 1e-1  # the same in bf16 autocast (token losses ~10.8; GEMM shapes differ)


SIZE_KEYS = ("n_layer", "n_head", "d_model")


def model_size(name: str) -> dict[str, int]:
    """n_layer, n_head and d_model of a named size, read from its `key: int` lines in
    conf/model/<name>.yaml (this machine may have torch and numpy only: no yaml, no omegaconf)."""
    path = ROOT / "conf" / "model" / f"{name}.yaml"
    values = {
        key: int(value)
        for key, value in re.findall(r"^(\w+):\s*(\d+)\s*(?:#.*)?$", path.read_text(), flags=re.MULTILINE)
    }
    missing = [key for key in SIZE_KEYS if key not in values]
    if missing:
        raise ValueError(f"{path} does not set {', '.join(missing)}")
    return {key: values[key] for key in SIZE_KEYS}


class Report:
    def __init__(self):
        self.checks: list[dict] = []

    def check(self, name: str, backend: str, value: float, tolerance: float, at_least: bool = False) -> None:
        passed = value >= tolerance if at_least else value <= tolerance
        op = ">=" if at_least else "<="
        self.checks.append(
            {
                "check": name,
                "backend": backend,
                "value": value,
                "tolerance": f"{op} {tolerance:g}",
                "passed": passed,
            }
        )
        print(
            f"  {'ok  ' if passed else 'FAIL'} {backend:7s} {name:42s} {value:.3e} ({op} {tolerance:g})",
            flush=True,
        )

    def fail(self, name: str, backend: str, message: str) -> None:
        self.checks.append(
            {"check": name, "backend": backend, "value": None, "passed": False, "error": message}
        )
        print(f"  FAIL {backend:7s} {name}: {message}", flush=True)

    @contextlib.contextmanager
    def guard(self, stage: str, backend: str):
        """A crash inside `stage` becomes one failed check with its error; the run goes on."""
        try:
            yield
        except Exception as error:  # any failure of a kernel or a compile is a result here
            message = f"{type(error).__name__}: {error}".splitlines()[0][:400]
            if isinstance(error, TypeError) and "window_size" in message:
                message += " (varlen_attn without window_size: the project needs torch >= 2.11)"
            self.fail(f"{stage}: runs", backend, message)
            torch.cuda.empty_cache()

    @property
    def passed(self) -> bool:
        return all(c["passed"] for c in self.checks)


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


# ------------------------------------------------------------------------------------ attention


def attend(backend, q, k, v, lengths, cotangent):
    """Output and (dq, dk, dv) of `backend` on fresh leaves of q, k, v."""
    from pretrain.model.attention import attention, prepare_attention

    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    meta = prepare_attention(backend, cu, np.asarray(lengths, dtype=np.int64), q.device)
    out = attention(*leaves, meta)
    grads = torch.autograd.grad(out, leaves, cotangent.to(out.dtype))
    return out.detach(), grads


SEGMENTS = (1, 2, 7, 64, 127, 128, 129, 300, 511, 1000, 2048, 33, 4096, 5, 250)  # tile edges, tiny, full


def attention_checks(
    report: Report, device: torch.device, segments=SEGMENTS, heads: int = 12, dim: int = 64
) -> None:
    print("attention level: bf16 vs fp32 sdpa reference", flush=True)
    lengths = np.array(segments)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    gen = torch.Generator(device).manual_seed(0)
    q, k, v, cotangent = (
        torch.randn(int(lengths.sum()), heads, dim, device=device, generator=gen) for _ in range(4)
    )
    ref_out, ref_grads = attend("sdpa", q, k, v, lengths, cotangent)
    half = [x.bfloat16() for x in (q, k, v)]
    for backend in ("sdpa", "varlen", "flex"):  # bf16 sdpa: what bf16 alone costs, for context
        out = None
        with report.guard("attention packed vs reference", backend):
            out, grads = attend(backend, *half, lengths, cotangent)
            report.check("packed vs fp32 sdpa: out rel", backend, rel(out, ref_out), TOL_ATTN_REL)
            report.check("packed vs fp32 sdpa: max |out|", backend, max_abs(out, ref_out), TOL_ATTN_MAX)
            for name, g, r in zip("qkv", grads, ref_grads, strict=True):
                report.check(f"packed vs fp32 sdpa: d{name} rel", backend, rel(g, r), TOL_ATTN_REL)
        if backend == "sdpa" or out is None:
            continue
        # A few segments alone (default segments: the full-capacity one, one across a tile edge, a tiny one).
        for seg in (12, 6, 2):
            with report.guard(f"segment of {lengths[seg]} alone", backend):
                span = slice(starts[seg], starts[seg + 1])
                o, g = attend(backend, *(x[span] for x in half), lengths[seg : seg + 1], cotangent[span])
                report.check(
                    f"segment of {lengths[seg]} alone vs packed: out rel",
                    backend,
                    rel(o, out[span]),
                    TOL_ALONE_REL,
                )
                worst = max(rel(a, b[span]) for a, b in zip(g, grads, strict=True))
                report.check(
                    f"segment of {lengths[seg]} alone vs packed: grads rel", backend, worst, TOL_ALONE_REL
                )
        # Isolation: replace segment 9 (1000 tokens by default) entirely; the rest must not move.
        with report.guard("attention isolation", backend):
            changed = slice(starts[9], starts[10])
            other = torch.ones(len(q), dtype=torch.bool, device=device)
            other[changed] = False
            perturbed = [x.clone() for x in half]
            for x in perturbed:
                x[changed] = torch.randn_like(x[changed]) * 3
            o2, g2 = attend(backend, *perturbed, lengths, cotangent)
            moved = max_abs(o2[other], out[other])
            report.check("isolation: other segments max |out|", backend, moved, TOL_ISOLATION_OUT)
            worst = max(rel(a[other], b[other]) for a, b in zip(g2, grads, strict=True))
            report.check("isolation: other segments grads rel", backend, worst, TOL_ISOLATION_GRAD)


# ---------------------------------------------------------------------------------------- model


def model_checks(
    report: Report, device: torch.device, width: int = 1024, documents: int = 40, d_model: int = 768
) -> None:
    from synthetic import synthetic_chunks

    from pretrain.data import gather_packed, gather_padded
    from pretrain.data.batching.packing import best_fit_decreasing
    from pretrain.data.tokens import GPT2_VOCAB_SIZE
    from pretrain.model import GPT, GPTConfig

    print("model level: 2-layer GPT-2 width, bf16 autocast vs fp32 sdpa", flush=True)
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=GPT2_VOCAB_SIZE, n_layer=2, n_head=d_model // 64, d_model=d_model, max_seq_len=width
    )
    model = GPT(config, attn="sdpa").to(device)
    # Untruncated documents (<= width inputs) so the padded policy holds each in one row.
    split, _ = synthetic_chunks(documents, width, seed=1)
    keep = np.flatnonzero(split.lengths - 1 <= width)
    starts, inputs = split.offsets[keep], split.lengths[keep] - 1
    order, ptr = best_fit_decreasing(inputs, 2 * width)
    packed = gather_packed(split.tokens, starts[order], inputs[order], np.diff(ptr), 2 * width).to(device)
    padded = gather_padded(split.tokens, starts[order], inputs[order], row_width=width).to(device)
    bounds = np.concatenate([[0], np.cumsum(inputs[order])])

    def step(backend, batch, dtype):
        model.attn_backend = backend
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            losses = model.token_losses(batch)
            (losses.sum() / batch.num_targets).backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        return losses.detach(), grads

    ref_losses, ref_grads = step("sdpa", packed, torch.float32)
    ref_loss = float(ref_losses.sum() / packed.num_targets)
    pad_ref, _ = step("sdpa", padded, torch.float32)
    real = torch.arange(width, device=device)[None, :] < padded.pack_lengths.to(device)[:, None]
    pad_vs_packed = max_abs(pad_ref.view(-1, width)[real], ref_losses)
    report.check("padded vs packed (fp32): max |token loss|", "sdpa", pad_vs_packed, TOL_PADDED_PACKED_FP32)

    changed_tokens = packed.input_ids.clone()
    doc = slice(int(bounds[3]), int(bounds[4]))
    changed_tokens[doc] = (
        changed_tokens[doc] + 1 + torch.arange(doc.stop - doc.start, device=device)
    ) % 50000
    changed = replace(packed, input_ids=changed_tokens)
    other = torch.ones(packed.num_tokens, dtype=torch.bool, device=device)
    other[doc] = False

    for backend in ("sdpa", "varlen", "flex"):
        with report.guard("model vs fp32 sdpa model", backend):
            losses, grads = step(backend, packed, torch.bfloat16)
            loss = float(losses.sum() / packed.num_targets)
            report.check(
                "loss vs fp32 sdpa model: rel", backend, abs(loss - ref_loss) / ref_loss, TOL_MODEL_LOSS
            )
            cos = float(torch.nn.functional.cosine_similarity(grads, ref_grads, dim=0))
            report.check(
                "param grads vs fp32 sdpa model: cosine", backend, cos, TOL_MODEL_GRAD_COS, at_least=True
            )
        with report.guard("model isolation and padded == packed", backend), torch.no_grad():
            model.attn_backend = backend
            with torch.autocast("cuda", dtype=torch.bfloat16):
                before, after = model.token_losses(packed), model.token_losses(changed)
                pad = model.token_losses(padded)
            moved = max_abs(after[other], before[other])
            report.check("isolation: other docs max |token loss|", backend, moved, TOL_MODEL_ISOLATION)
            gap = max_abs(pad.view(-1, width)[real], before)
            report.check("padded vs packed (bf16): max |token loss|", backend, gap, TOL_PADDED_PACKED)


# ------------------------------------------------------------------------------------ throughput

POLICIES = ("padded", "bestfit")
BACKENDS = ("sdpa", "varlen", "flex")  # in this order: flex compiles, and rows past the budget are skipped


def throughput(
    device: torch.device,
    steps: int,
    warmup: int,
    capacity: int = 4096,
    rows: int = 35,
    size: str = "gpt2-small",
    backends: tuple[str, ...] = BACKENDS,
    peak: float | None = None,
    deadline: float = float("inf"),
) -> list[dict]:
    """Training steps (forward, backward, AdamW) of `size` at `rows` x `capacity`, bf16 autocast, for
    bestfit packs and padded rows under each backend: real tokens/s and MFU (model FLOPs of the real
    segment lengths, never the pad width, over `peak` FLOP/s). Rows left when `deadline`
    (time.perf_counter()) has passed are recorded as skipped."""
    from synthetic import packed_batches, synthetic_chunks

    from pretrain.data import gather_padded
    from pretrain.data.tokens import GPT2_VOCAB_SIZE
    from pretrain.model import GPT, GPTConfig
    from pretrain.model.flops import training_flops

    cuda = device.type == "cuda"
    print(f"throughput: {size}, {rows} x {capacity}, bf16 autocast, training step", flush=True)
    split, table = synthetic_chunks(int(rows * capacity / 500), capacity, seed=2)
    # Best-fit-decreasing leaves only its last packs part-empty: batch 0 is a bestfit-like 35 x 4096.
    packed = packed_batches(split, table, capacity, rows)[0]
    padded = gather_padded(split.tokens, table.start[:rows], table.length[:rows], capacity)
    batches = {
        # Segment lengths for the FLOPs: each chunk of a pack; each padded row's real tokens only.
        "bestfit": (packed.to(device), np.diff(packed.cu_seqlens.numpy())),
        "padded": (padded.to(device), padded.pack_lengths.numpy()),
    }
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=GPT2_VOCAB_SIZE, max_seq_len=capacity, **model_size(size))
    model = GPT(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=cuda)
    results = []
    flops_of = {policy: training_flops(config, segments) for policy, (_, segments) in batches.items()}
    for backend in backends:
        for policy in POLICIES:
            batch, flops = batches[policy][0], flops_of[policy]
            model.attn_backend = backend
            row: dict = {
                "policy": policy,
                "attn": backend,
                "computed_rows": batch.num_tokens,
                "real_tokens": batch.real_tokens,
                "model_tflop_per_step": flops / 1e12,
            }
            if time.perf_counter() > deadline:
                row["error"] = "skipped: past the time budget (--budget-s)"
                print(f"  {policy} {backend}: {row['error']}", flush=True)
                results.append(row)
                continue
            try:
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                started = time.perf_counter()
                for i in range(warmup + steps):
                    if i == warmup:
                        if cuda:
                            torch.cuda.synchronize()
                        started = time.perf_counter()
                    with torch.autocast(device.type, dtype=torch.bfloat16):
                        loss = model.loss(batch, batch.num_targets)
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                if cuda:
                    torch.cuda.synchronize()
                seconds = (time.perf_counter() - started) / steps
                row.update(
                    ms_per_step=1e3 * seconds,
                    real_tokens_per_s=batch.real_tokens / seconds,
                    model_tflops=flops / seconds / 1e12,
                    mfu=flops / seconds / peak if peak else None,
                    peak_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                )
            except Exception as error:  # out of memory or a kernel that cannot run: a row, not a crash
                row["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:400]
                optimizer.zero_grad(set_to_none=True)
                if cuda:
                    torch.cuda.empty_cache()
            print(
                "  "
                + ", ".join(f"{k}={v:,.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                flush=True,
            )
            results.append(row)
    base = next((r for r in results if (r["policy"], r["attn"]) == ("padded", "sdpa")), {})
    for row in results:
        if "real_tokens_per_s" in row and "real_tokens_per_s" in base:
            row["speedup_vs_padded_sdpa"] = row["real_tokens_per_s"] / base["real_tokens_per_s"]
    return results


# -------------------------------------------------------------------------------------- preflight


def varlen_api_check(report: Report) -> bool:
    """The project calls varlen_attn(q, k, v, cu, cu, max_q, max_k, window_size=(-1, 0)): the keyword
    arrived in torch 2.11 (2.9/2.10 had is_causal). Record one check; False if the call cannot bind."""
    import inspect

    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as error:
        report.fail("varlen API: torch.nn.attention.varlen.varlen_attn", "varlen", f"ImportError: {error}")
        return False
    signature = inspect.signature(varlen_attn)
    try:
        signature.bind("q", "k", "v", "cu", "cu", 1, 1, window_size=(-1, 0))
    except TypeError as error:
        report.fail(
            "varlen API: window_size keyword",
            "varlen",
            f"TypeError: {error}; this torch ({torch.__version__}) has varlen_attn{signature}, the project "
            "needs torch >= 2.11 (causal = window_size=(-1, 0))",
        )
        return False
    report.check("varlen API: window_size keyword binds", "varlen", 0.0, 0.0)
    return True


def varlen_strided_rows() -> dict:
    """Whether the flash varlen kernel takes q/k/v as the strided row views of one fused QKV projection
    (last dimension contiguous, rows 3 x width apart), as it takes dense copies: the project copies them
    today (attention/varlen.py); equal outputs and gradients here let that copy go. Recorded as a finding,
    not a check: either answer leaves the project correct."""
    from torch.nn.attention.varlen import varlen_attn

    torch.manual_seed(0)
    heads, dim, lengths = 12, 64, [700, 129, 7, 1188]
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32, device="cuda")
    qkv = torch.randn(sum(lengths), 3, heads, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(sum(lengths), heads, dim, device="cuda", dtype=torch.bfloat16)
    results = []
    for dense in (False, True):
        qkv.grad = None
        q, k, v = qkv.unbind(1)
        if dense:
            q, k, v = (x.contiguous() for x in (q, k, v))
        out = varlen_attn(q, k, v, cu, cu, max(lengths), max(lengths), window_size=(-1, 0))
        out.backward(grad)
        results.append((out.detach(), qkv.grad.clone()))
    (out, dqkv), (dense_out, dense_dqkv) = results
    finding = {
        "check": "varlen takes strided q/k/v rows (finding)",
        "out_max_abs_diff": float((out - dense_out).abs().max()),
        "grad_max_abs_diff": float((dqkv - dense_dqkv).abs().max()),
    }
    print(f"  note varlen  strided q/k/v rows: {finding}", flush=True)
    return finding


# ------------------------------------------------------------------------------------- markdown


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _fmt(value, spec: str = ".3g") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def markdown(result: dict) -> str:
    """The JSON result as two markdown tables: equivalence checks, then throughput and MFU."""
    meta = result["meta"]
    peak = meta.get("peak_tflops")
    lines = [
        f"# GPU check: {meta.get('device', '?')}",
        "",
        f"torch {meta.get('torch')} (CUDA {meta.get('cuda')}), python {meta.get('python')}, "
        f"{meta.get('seconds')} s; peak {_fmt(peak, '.0f')} bf16 TFLOP/s for MFU; "
        f"**{'all checks passed' if result['passed'] else 'FAILED'}**",
        "",
        "## varlen / flex / sdpa equivalence (forward and backward)",
        "",
        "| check | backend | value | tolerance | result |",
        "|---|---|---:|---|---|",
    ]
    for c in result["checks"]:
        value = _fmt(c.get("value"), ".3e") if c.get("value") is not None else _cell(c.get("error", "-"))
        verdict = "ok" if c["passed"] else "**FAIL**"
        lines.append(
            f"| {_cell(c['check'])} | {c['backend']} | {value} | {c.get('tolerance', '-')} | {verdict} |"
        )
    rows = result.get("throughput") or []
    if rows:
        lines += [
            "",
            f"## Training throughput: {meta.get('size', 'gpt2-small')}, {meta.get('rows', '?')} x "
            f"{meta.get('capacity', '?')}, bf16 autocast, forward + backward + AdamW",
            "",
            "MFU = model FLOPs of the real segment lengths (6N per token + attention; padded rows count "
            "their real tokens, not the pad width) / step time / peak.",
            "",
            "| policy | attn | real tokens | computed rows | ms/step | real tokens/s | model TFLOP/s | MFU "
            "| peak GiB | vs padded sdpa |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            if "error" in r:
                lines.append(
                    f"| {r['policy']} | {r['attn']} | {r['real_tokens']:,} | {r['computed_rows']:,} "
                    f"| {_cell(r['error'])} | | | | | |"
                )
                continue
            mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
            speedup = r.get("speedup_vs_padded_sdpa")
            lines.append(
                f"| {r['policy']} | {r['attn']} | {r['real_tokens']:,} | {r['computed_rows']:,} "
                f"| {r['ms_per_step']:.1f} | {r['real_tokens_per_s']:,.0f} | {r['model_tflops']:.1f} | {mfu} "
                f"| {_fmt(r.get('peak_gib'), '.1f')} | {_fmt(speedup, '.2f')}{'x' if speedup else ''} |"
            )
    return "\n".join(lines + setup_markdown(result.get("training_setup") or {})) + "\n"


def setup_markdown(setup: dict) -> list[str]:
    """The compile / FSDP / activation checkpointing rows as short tables."""
    lines: list[str] = []
    compiled = setup.get("compile") or {}
    if "speedup" in compiled:
        lines += [
            "",
            "## train.compile (gpt2-small, varlen, bf16, bestfit batches of 4 token counts)",
            "",
            "| graphs | recompiles after step 1 | compile s | first step ms | eager ms/step "
            "| compiled ms/step | speed-up | break-even steps |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| {compiled['graphs']} | {compiled['recompiles']} | {compiled['seconds']:.1f} "
            f"| {compiled['first_step_ms']:.0f} | {compiled['eager_ms_per_step']:.1f} "
            f"| {compiled['compiled_ms_per_step']:.1f} | {compiled['speedup']:.3f}x "
            f"| {_fmt(compiled['breakeven_steps'], '.0f')} |",
        ]
    rows = [r for r in setup.get("activation_checkpointing") or [] if isinstance(r, dict) and "peak_gib" in r]
    if rows:
        lines += [
            "",
            "## Activation checkpointing (gpt2-small, varlen, bf16, one bestfit batch)",
            "",
            "| recompute | peak GiB | ms/step |",
            "|---|---:|---:|",
        ]
        lines += [
            f"| {r['activation_checkpointing']} | {r['peak_gib']:.1f} | {r['ms_per_step']:.1f} |"
            for r in rows
        ]
    return lines


# ------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "gpu_check.json")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per throughput row")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (flex compiles here)")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument(
        "--skip-training-setup", action="store_true", help="no compile / FSDP / activation checkpointing"
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="bf16 peak for MFU (default: table)")
    parser.add_argument(
        "--budget-s", type=float, default=210.0, help="throughput rows still to start past this are skipped"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("skipped: no CUDA")
        return 0
    sys.path.insert(0, str(ROOT / "src"))  # also runs from a checkout without `pip install -e .`
    from gpu_training_checks import training_setup_rows

    from pretrain.model.flops import peak_flops

    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference must really be fp32
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda")
    name = torch.cuda.get_device_name()
    peak = peak_flops(name, args.peak_tflops)
    print(f"{name}, torch {torch.__version__} (CUDA {torch.version.cuda})", flush=True)
    if peak is None:
        print(f"  no peak TFLOP/s known for {name!r}: MFU is left out (pass --peak-tflops)", flush=True)
    started = time.perf_counter()
    report = Report()
    findings = []
    if varlen_api_check(report):
        try:
            findings.append(varlen_strided_rows())
        except Exception as error:  # the kernel refusing strided rows is the finding itself
            message = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            findings.append({"check": "varlen takes strided q/k/v rows (finding)", "error": message})
            print(f"  note varlen  strided q/k/v rows refused: {message}", flush=True)
    attention_checks(report, device)
    model_checks(report, device)
    torch.cuda.empty_cache()  # the check model is gone; hand its memory to the throughput runs
    size, capacity, rows = "gpt2-small", 4096, 35
    throughput_rows = (
        []
        if args.skip_throughput
        else throughput(
            device,
            args.steps,
            args.warmup,
            capacity=capacity,
            rows=rows,
            size=size,
            peak=peak,
            deadline=started + args.budget_s,
        )
    )
    setup = (
        {}
        if args.skip_training_setup
        else training_setup_rows(report, device, model_size(size), capacity, rows, args.steps)
    )
    result = {
        "passed": report.passed,
        "torch": torch.__version__,
        "device": name,
        "checks": report.checks,
        "findings": findings,
        "throughput": throughput_rows,
        "training_setup": setup,
        "meta": {
            "device": name,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": sys.version.split()[0],
            "peak_tflops": peak / 1e12 if peak else None,
            "size": size,
            "capacity": capacity,
            "rows": rows,
            "steps": args.steps,
            "warmup": args.warmup,
            "seconds": round(time.perf_counter() - started, 1),
        },
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    table = args.output.with_suffix(".md")
    table.write_text(markdown(result))
    failed = [c for c in report.checks if not c["passed"]]
    print(
        f"{len(report.checks) - len(failed)}/{len(report.checks)} checks passed in "
        f"{result['meta']['seconds']} s; wrote {args.output} and {table}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
