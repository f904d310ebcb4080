"""scripts/gpu_bench.py on the CPU: its dry run (model=tiny, the embedded corpus, sdpa, fp32) writes the
GPU run's JSON and table with the three loops' rows, the product and the torch-only loop train on the
same batches (the same first loss), the nanoGPT-style peer trains, and --profile's kernel table adds
up. Its kernel buckets are checked on real CUDA kernel names."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_bench.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench = _load()


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[dict, Path]:
    """One dry run with --profile (both policies, 1 warmup + 2 timed steps): its JSON and output path."""
    out = tmp_path_factory.mktemp("gpu-bench")
    cache_root = out / "cache"  # the embedded corpus's cache, built by the run (PRETRAIN_CACHE_ROOT wins)
    env = {**os.environ, "PRETRAIN_CACHE_ROOT": str(cache_root)}
    output = out / "gpu_bench.json"
    command = [sys.executable, str(SCRIPT), "--dry-run", "--profile", "--output", str(output)]
    command += ["--cache-root", str(cache_root), "--work-dir", str(out / "runs")]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "| loop | context | policy | attn |" in done.stdout
    return json.loads(output.read_text()), output


def _rows(result: dict, loop: str) -> list[dict]:
    return [r for r in result["rows"] if r["loop"] == loop]


def test_the_dry_run_writes_three_loops_side_by_side(dry_run):
    result, output = dry_run
    assert result["device"] == "cpu" and result["dry_run"] and result["torch"] and result["complete"]
    assert "training_flops" in result["mfu_formula"] and "peak_flops" in result["mfu_formula"]
    for loop, count in (("product", 2), ("torch", 2), ("peer", 1)):
        rows = _rows(result, loop)
        assert len(rows) == count, result["rows"]
        for row in rows:
            assert row["status"] == "ok", row
            assert row["context"] == 128 and row["steps_timed"] == 2
            assert row["real_tokens_per_s"] > 0 and row["ms_per_step"] > 0
            assert row["mfu"] is None and row["peak_memory_gib"] is None  # no peak FLOP/s, no CUDA
    assert {r["policy"] for r in _rows(result, "product")} == {"padded", "bestfit"}
    for comparison in result["comparisons"]:
        assert comparison["product_over_torch"] > 0 and comparison["peer_over_product"] > 0
    table = output.with_suffix(".md").read_text()
    assert table.count("| product | 128 |") == 2 and table.count("| peer | 128 |") == 1
    assert "(a)/(b)" in table and "not a correctness peer" in table


def test_product_and_torch_loop_train_on_identical_batches(dry_run):
    """Same sampler, same seed, same model init, fp32 on CPU: the same real tokens and targets at
    every step, and the same first loss (before any optimizer step could differ)."""
    result, _ = dry_run
    torch_rows = {r["policy"]: r for r in _rows(result, "torch")}
    for product in _rows(result, "product"):
        plain = torch_rows[product["policy"]]
        assert product["real_tokens"] == plain["real_tokens"] and len(plain["real_tokens"]) == 3
        assert product["targets"] == plain["targets"]
        assert product["same_batches_as_planned"]
        assert abs(product["first_loss"] - plain["first_loss"]) <= 1e-5
        assert 9.0 < product["first_loss"] < 12.0  # ~ln(50257) at initialisation
    assert all(c["same_batches"] and c["first_loss_diff"] <= 1e-5 for c in result["comparisons"])


def test_the_peer_trains_on_contiguous_rows(dry_run):
    result, _ = dry_run
    (peer,) = _rows(result, "peer")
    assert all(math.isfinite(loss) for loss in peer["losses"]) and len(peer["losses"]) == 3
    assert 9.0 < peer["losses"][0] < 12.0
    assert peer["rows"] == 4 and peer["vocab_size"] == 50304 and peer["compiled"] is False


def test_the_peer_accumulates_micro_batches_to_the_step_it_would_take_whole():
    """nanoGPT's gradient accumulation: 35 x 4096 goes through as 8 x 4 rows and 3; the first loss (the
    step's mean over its tokens) and the updated weights equal one whole batch's, fp32 on CPU."""
    import numpy as np
    import torch
    from nanogpt_peer import PeerConfig, micro_batches, train_peer

    assert micro_batches(35, 4096) == [4] * 8 + [3] and micro_batches(140, 1024) == [16] * 8 + [12]
    assert micro_batches(4, 128) == [4] and micro_batches(2, 1 << 20) == [1, 1]
    tokens = np.random.default_rng(0).integers(0, 300, size=4000).astype(np.uint16)
    config = PeerConfig(block_size=16, vocab_size=320, n_layer=2, n_head=2, n_embd=32)
    cpu = torch.device("cpu")
    whole = train_peer(tokens, config, rows=5, steps=2, device=cpu, compile=False)
    split = train_peer(tokens, config, rows=5, steps=2, device=cpu, compile=False, micro_tokens=32)
    assert whole["micro_batches"] == [5] and split["micro_batches"] == [2, 2, 1]
    assert whole["losses"] == pytest.approx(split["losses"], abs=1e-5)


def test_the_profile_table_adds_up(dry_run):
    result, output = dry_run
    (path,) = result["profiles"]
    profiled = json.loads(Path(path).with_suffix(".json").read_text())
    buckets = profiled["by_category_ms"]
    assert set(buckets) == {"matmul", "attention", "loss", "optimizer", "elementwise", "other"}
    assert math.isclose(sum(buckets.values()), profiled["total_ms"], rel_tol=1e-9)
    top = profiled["top"]
    assert 0 < len(top) <= 40 and [r["total_ms"] for r in top] == sorted(
        (r["total_ms"] for r in top), reverse=True
    )
    assert sum(r["total_ms"] for r in top) <= profiled["total_ms"] * (1 + 1e-9)
    for name in ("matmul", "attention", "loss", "optimizer"):
        assert buckets[name] > 0, buckets  # one training step has each
    # Self times on one thread never overlap: their sum fits in the step's wall time.
    assert 0 < profiled["total_ms"] <= profiled["wall_ms"] * 1.01
    assert math.isclose(profiled["busy_fraction"], profiled["total_ms"] / profiled["wall_ms"])
    assert Path(path).name == f"{output.stem}_profile_128_bestfit_sdpa.md"
    assert "| category | ms | share |" in Path(path).read_text()


@pytest.mark.parametrize(
    ("name", "phase", "expected"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64 aten::mm", None, "matmul"),
        ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTT aten::addmm", None, "matmul"),
        (
            "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits> aten::_flash_attention_forward",
            None,
            "attention",
        ),
        ("void at::native::cunn_SoftMaxForward<4, float> aten::_log_softmax", None, "loss"),
        (
            "void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl> aten::gelu",
            None,
            "elementwise",
        ),
        (
            "triton_poi_fused_add_native_layer_norm_0 triton_poi_fused_add_native_layer_norm_0",
            None,
            "elementwise",
        ),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel aten::_fused_adamw_",
            None,
            "optimizer",
        ),
        (
            "void at::native::reduce_kernel<512, 1> aten::linalg_vector_norm",
            bench.PHASE_OPTIMIZER,
            "optimizer",
        ),
        ("Memcpy HtoD (Pageable -> Device) aten::copy_", bench.PHASE_DATA, "other"),
        ("void at::native::elementwise_kernel<128, 2> aten::copy_", None, "elementwise"),
        ("aten::expand", None, "other"),
    ],
)
def test_kernel_buckets(name, phase, expected):
    assert bench.category(name, phase) == expected


def test_rows_past_the_budget_are_recorded_as_skipped(tmp_path):
    output = tmp_path / "skipped.json"
    argv = ["--dry-run", "--budget-s", "0", "--output", str(output), "--cache-root", str(tmp_path)]
    assert bench.main(argv) == 0
    result = json.loads(output.read_text())
    assert [(r["loop"], r["status"], r["reason"]) for r in result["rows"]] == [
        ("product", "skipped", "budget"),
        ("torch", "skipped", "budget"),
        ("peer", "skipped", "budget"),
        ("product", "skipped", "budget"),
        ("torch", "skipped", "budget"),
    ]
    assert "| product | 128 | bestfit | sdpa | skipped |" in output.with_suffix(".md").read_text()


@pytest.mark.e2e  # it trains (the torch-only loop and the peer), in this process
def test_a_product_run_past_its_timeout_is_a_failed_row_and_the_rest_still_run(tmp_path, cache_root):
    output = tmp_path / "timeout.json"
    code = bench.main(
        ["--dry-run", "--policies", "bestfit", "--row-timeout-s", "0.5", "--output", str(output)]
        + ["--cache-root", str(cache_root), "--work-dir", str(tmp_path / "runs")]
    )
    assert code == 0
    result = json.loads(output.read_text())
    statuses = [(r["loop"], r["status"]) for r in result["rows"]]
    assert statuses == [("product", "failed"), ("torch", "ok"), ("peer", "ok")]
    assert "--row-timeout-s" in result["rows"][0]["reason"] and result["complete"]
    assert result["comparisons"][0]["product_over_torch"] is None
