"""Golden batches: what every data policy served, and the losses it gave, before the policy plug-in
refactor (recorded on main at 1728807). A refactor of the data path must serve bitwise the same
batches (sha256 of each update's input ids and cu_seqlens, the chunks and real targets of each
microbatch) and give the same losses; a sampler state saved then must still resume. The recorded
cases are the policies' `golden_variants`; a policy without one (recorded or not yet) is checked to
serve the same batches and losses in two runs.

Re-record (only for an intended change of behaviour, saying so in the commit):
    PRETRAIN_RECORD_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden_batches.py
"""

from __future__ import annotations

import csv
import json
import os
import zipfile
from pathlib import Path

import pytest
from helpers import POLICY_VARIANTS, SHARED_CACHE, golden_variants, module_cache_root, policies_where

from pretrain.config import load_config
from pretrain.training.run import train

GOLDEN = Path(__file__).parent / "golden" / "batches.json"
RECORD = os.environ.get("PRETRAIN_RECORD_GOLDEN") == "1"

cache_root = module_cache_root(SHARED_CACHE)  # one cache (the embedded corpus) for every case

COMMON = [
    "experiment=smoke",
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "data.max_seq_len=64",
    "train.batch_size=3",
    "train.max_steps=4",
    "train.warmup_steps=1",
    "train.val_every_n_steps=2",
    "train.val_batches=1",
    "train.eval_microbatch_tokens=256",
    "train.checkpoint_every_n_steps=2",
    "train.deterministic=true",
    "record_batches=true",
    "progress_bar=false",
    "logger=csv",
]

CASES = {case: [f"data={policy}", *overrides] for case, (policy, *overrides) in golden_variants().items()}
UNRECORDED = policies_where(golden_variants={})  # the policies with no recorded case


def _metrics(run_dir: Path) -> dict[str, dict[str, str]]:
    """Losses by step, as the strings metrics.csv holds (exact: a float's shortest repr)."""
    out: dict[str, dict[str, str]] = {}
    with open(run_dir / "metrics.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            for key in ("train/loss", "val/loss", "train/num_targets", "train/tokens"):
                if row.get(key):
                    out.setdefault(key, {})[row["step"]] = row[key]
    return out


def _sampler_state(checkpoint: Path) -> dict:
    """The sampler state a checkpoint holds, read from its pickle without importing the checkpoint
    machinery (the golden must not depend on the code it guards)."""
    import torch

    assert zipfile.is_zipfile(checkpoint)
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    (datamodule,) = [v for k, v in state.items() if isinstance(v, dict) and "train_sampler" in v]
    return json.loads(json.dumps(datamodule["train_sampler"]))


def _run(tmp_path: Path, name: str, *extra: str) -> Path:
    out = tmp_path / name
    train(load_config([*COMMON, *CASES.get(name, ()), f"output_dir={out}", *extra]))
    return out


def _observed(run_dir: Path) -> dict:
    batches = [json.loads(line) for line in (run_dir / "batches.rank0.jsonl").read_text().splitlines()]
    return {
        "digests": [b["digest"] for b in batches],
        "chunks": [b["chunks"] for b in batches],
        "num_targets": [b["num_targets"] for b in batches],
        "metrics": _metrics(run_dir),
    }


def _golden() -> dict:
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


@pytest.mark.parametrize("name", sorted(CASES))
def test_policy_serves_the_recorded_batches_and_losses(tmp_path, cache_root, name):
    run_dir = _run(tmp_path, name)
    observed = _observed(run_dir)
    if RECORD:
        golden = _golden()
        golden[name] = {
            **observed,
            "sampler_state_step2": _sampler_state(run_dir / "checkpoints" / "step000002.ckpt"),
        }
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        return
    want = _golden()[name]
    assert len(observed["digests"]) == 4
    assert observed["digests"] == want["digests"]
    assert observed["chunks"] == want["chunks"]
    assert observed["num_targets"] == want["num_targets"]
    assert_same_metrics(observed["metrics"], want["metrics"])


LOSS_TOLERANCE = 1e-6
"""Relative, about 10 float32 ulps: the batches are exact everywhere, the losses carry the float32
kernels' rounding, which differs between CPUs (an AMD EPYC with AVX-512 puts a train/loss 2 ulps,
1.8e-7, and val/loss ~2e-9 from the recording's)."""


def assert_same_metrics(observed: dict, want: dict) -> None:
    """Token counts exactly, losses to LOSS_TOLERANCE (relative), at the same steps."""
    assert {key: list(steps) for key, steps in observed.items()} == {
        key: list(steps) for key, steps in want.items()
    }
    for key, steps in want.items():
        for step, value in steps.items():
            if key.endswith("loss"):
                assert float(observed[key][step]) == pytest.approx(float(value), rel=LOSS_TOLERANCE), (
                    key,
                    step,
                )
            else:
                assert observed[key][step] == value, (key, step)


@pytest.mark.parametrize("policy", UNRECORDED)
def test_a_policy_without_a_record_serves_the_same_batches_and_losses_twice(tmp_path, cache_root, policy):
    """Its first test variant on the golden run (vsl's max_seq_len 64 is a power of two), twice."""
    case = next(case for case, (chosen, *_) in POLICY_VARIANTS.items() if chosen == policy)
    overrides = [f"data={policy}", *POLICY_VARIANTS[case][1:]]
    first, second = (_observed(_run(tmp_path / str(i), policy, *overrides)) for i in range(2))
    assert len(first["digests"]) == 4 and first["metrics"]["train/loss"]
    assert first == second


def test_golden_cases_tell_the_policies_apart():
    """The recorded cases exercise what they name: the mask changes the concat windows' batches."""
    golden = _golden()
    masked, unmasked = golden["prepacked_concat"], golden["prepacked_concat_nomask"]
    assert masked["chunks"] == unmasked["chunks"]  # the same windows ...
    assert masked["digests"] != unmasked["digests"]  # ... as other segments
    assert sum(map(sum, masked["num_targets"])) < sum(map(sum, unmasked["num_targets"]))
    assert golden["bestfit"]["digests"] != golden["prepacked_bfd"]["digests"]
