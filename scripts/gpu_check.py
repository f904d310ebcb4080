"""`make gpu-check`: the CPU suite's attention checks for the CUDA-only paths, then a throughput table.

1. Attention level, varlen and compiled flex in bf16 (forward and backward) against the fp32 sdpa
   reference (itself checked against a naive per-segment softmax on CPU): packed == reference,
   packed == each segment alone, and changing one segment leaves the others unchanged.
2. Model level (2-layer GPT-2 width, bf16 autocast): loss and gradients vs the fp32 sdpa model,
   document isolation, padded policy == packed policy on untruncated documents.
3. gpt2-small at 35 packs x 4096 (bf16 autocast): forward+backward real tokens/s under sdpa, flex
   and varlen, and the padded policy on the same kind of documents.

One command, a few minutes on one H100/H200. Writes JSON to --output and exits 1 if a check fails.
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

    @contextlib.contextmanager
    def guard(self, stage: str, backend: str):
        """A crash inside `stage` becomes one failed check with its error; the run goes on."""
        try:
            yield
        except Exception as error:  # any failure of a kernel or a compile is a result here
            message = f"{type(error).__name__}: {error}".splitlines()[0][:400]
            self.checks.append(
                {
                    "check": f"{stage}: runs",
                    "backend": backend,
                    "value": None,
                    "passed": False,
                    "error": message,
                }
            )
            print(f"  FAIL {backend:7s} {stage}: {message}", flush=True)
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
    from pretrain.data import gather_packed, gather_padded
    from pretrain.data.packing import best_fit_decreasing
    from pretrain.data.synthetic import synthetic_chunks
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


def throughput(
    device: torch.device,
    steps: int,
    warmup: int,
    capacity: int = 4096,
    rows: int = 35,
    size: str = "gpt2-small",
) -> list[dict]:
    from pretrain.data import gather_padded
    from pretrain.data.synthetic import packed_batches, synthetic_chunks
    from pretrain.data.tokens import GPT2_VOCAB_SIZE
    from pretrain.model import GPT, GPTConfig

    print(f"throughput: {size}, {rows} x {capacity}, bf16 autocast, forward+backward", flush=True)
    split, table = synthetic_chunks(int(rows * capacity / 500), capacity, seed=2)
    # Best-fit-decreasing leaves only its last packs part-empty: batch 0 is a bestfit-like 35 x 4096.
    packed = packed_batches(split, table, capacity, rows)[0].to(device)
    padded = gather_padded(split.tokens, table.start[:rows], table.length[:rows], capacity).to(device)
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=GPT2_VOCAB_SIZE, max_seq_len=capacity, **model_size(size))
    model = GPT(config).to(device)
    results = []
    for policy, batch, backend in [
        ("packed", packed, "sdpa"),
        ("packed", packed, "flex"),
        ("packed", packed, "varlen"),
        ("padded", padded, "sdpa"),
        ("padded", padded, "varlen"),
    ]:
        model.attn_backend = backend
        row = {
            "policy": policy,
            "attn": backend,
            "computed_rows": batch.num_tokens,
            "real_tokens": batch.real_tokens,
        }
        try:
            torch.cuda.reset_peak_memory_stats()
            for i in range(warmup + steps):
                if i == warmup:
                    torch.cuda.synchronize()
                    started = time.perf_counter()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    model.loss(batch, batch.num_targets).backward()
                model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            seconds = (time.perf_counter() - started) / steps
            row.update(
                ms_per_step=1e3 * seconds,
                real_tokens_per_s=batch.real_tokens / seconds,
                peak_gib=torch.cuda.max_memory_allocated() / 2**30,
            )
        except Exception as error:  # out of memory or a kernel that cannot run: a row, not a crash
            row["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:400]
            model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
        print(
            "  " + ", ".join(f"{k}={v:,.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
            flush=True,
        )
        results.append(row)
    base = next((r for r in results if r["policy"] == "padded" and "real_tokens_per_s" in r), None)
    for row in results:
        if base and "real_tokens_per_s" in row:
            row["speedup_vs_padded_sdpa"] = row["real_tokens_per_s"] / base["real_tokens_per_s"]
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "gpu_check.json")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per throughput row")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("skipped: no CUDA")
        return 0
    sys.path.insert(0, str(ROOT / "src"))  # also runs from a checkout without `pip install -e .`
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference must really be fp32
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda")
    started = time.perf_counter()
    report = Report()
    attention_checks(report, device)
    model_checks(report, device)
    torch.cuda.empty_cache()  # the check model is gone; hand its memory to the throughput runs
    rows = [] if args.skip_throughput else throughput(device, args.steps, args.warmup)
    result = {
        "passed": report.passed,
        "checks": report.checks,
        "throughput": rows,
        "meta": {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "seconds": round(time.perf_counter() - started, 1),
        },
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    failed = [c for c in report.checks if not c["passed"]]
    print(f"{len(report.checks) - len(failed)}/{len(report.checks)} checks passed; wrote {args.output}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
