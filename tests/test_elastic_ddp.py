"""Elastic resume with real ranks (gloo on CPU, `train.py` as a user starts it): 2 ranks train 3
updates; their checkpoint resumes on 1 rank and on 3 ranks (the latter with another train.batch_size),
and what every rank records (`record_batches=true`) continues the epoch's global order exactly where
the 2 ranks stopped, for every policy (about 1 min each on 2 idle cores); every policy case (options
included) is also checked at sampler level in test_elastic_resume.py. A resume that cannot be exact is
refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import POLICIES, SHARED_CACHE, module_cache_root

from pretrain.config import load_config, to_config
from pretrain.data.batching.policies import REGISTRY, PolicySettings
from pretrain.data.batching.samplers import build_sampler
from pretrain.data.ingest.cache import CacheSpec
from pretrain.data.ingest.prepare import prepare_cache

REPO = Path(__file__).resolve().parents[1]
cache_root = module_cache_root(SHARED_CACHE)

COMMON = [
    "experiment=smoke",
    "trainer=ddp",
    "trainer.accelerator=cpu",
    "trainer.precision=32-true",
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "data.max_seq_len=64",
    "train.batch_size=2",
    "train.warmup_steps=1",
    "train.val_every_n_steps=100",
    "train.val_batches=1",
    "train.eval_microbatch_tokens=256",
    "record_batches=true",
    "progress_bar=false",
    "logger=csv",
]
SAVED_AT = 3  # updates the 2 ranks train before the checkpoint that is resumed


def launch(out: Path, devices: int, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "train.py",
        *COMMON,
        f"trainer.devices={devices}",
        *overrides,
        f"hydra.run.dir={out}",
    ]
    # The environment (cache root, offline) is the fixtures'.
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def trained(out: Path, devices: int, *overrides: str) -> Path:
    proc = launch(out, devices, *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def served_chunks(run_dir: Path, ranks: int, steps: range) -> list[int]:
    """The chunks every rank trained, in global batch order: update, then microbatch, then rank
    (rank r's microbatch j of update u is global batch (u x accumulation + j) x ranks + r)."""
    records = {
        r: [json.loads(line) for line in (run_dir / f"batches.rank{r}.jsonl").open()] for r in range(ranks)
    }
    assert all([record["step"] for record in records[r]] == list(steps) for r in range(ranks))
    out: list[int] = []
    for u in range(len(steps)):
        for j in range(len(records[0][u]["chunks"])):
            for r in range(ranks):
                out += records[r][u]["chunks"][j]
    return out


def units_in_order(tmp_path: Path, *overrides: str) -> list[list[int]]:
    """The chunks of each unit of epoch 0, in the order the 2-rank run planned it (its world size:
    vsl groups the order by the update size)."""
    config = to_config(load_config([*COMMON, *overrides, f"output_dir={tmp_path / 'plan'}"]))
    settings = PolicySettings.from_config(config.data, config.train, config.seed)
    cache = prepare_cache(CacheSpec.from_config(config), progress=False)
    sampler = build_sampler(settings, cache.split("train"), world_size=2, packs_dir=cache.packs_dir)
    layout = sampler.plan(0).layout
    return [layout.ids(layout.items_of([unit])[0]).tolist() for unit in sampler.plan(0).ordered()]


def flat(units: list[list[int]]) -> list[int]:
    return [chunk for unit in units for chunk in unit]


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one `error:` line of a refused launch (refused before any rank starts: once)."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    return line


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_a_resume_on_fewer_or_more_ranks_continues_the_global_order(tmp_path, cache_root, policy):
    data = f"data={policy}"
    two = trained(
        tmp_path / "two", 2, data, f"train.max_steps={SAVED_AT}", f"train.checkpoint_every_n_steps={SAVED_AT}"
    )
    checkpoint = f"ckpt_path={two / 'checkpoints' / f'step{SAVED_AT:06d}.ckpt'}"
    units = units_in_order(tmp_path, data)
    position = SAVED_AT * 2 * 2  # updates x ranks x train.batch_size
    assert served_chunks(two, 2, range(SAVED_AT)) == flat(units[:position])

    # One rank: 2 more updates of 2 units.
    one = trained(tmp_path / "one", 1, data, checkpoint, f"train.max_steps={SAVED_AT + 2}")
    assert served_chunks(one, 1, range(SAVED_AT, SAVED_AT + 2)) == flat(units[position : position + 4])

    if REGISTRY[
        policy
    ].whole_updates:  # updates of 3 x 2 units cannot regroup an epoch planned in updates of 2 x 2
        line = error_line(launch(tmp_path / "three", 3, data, checkpoint, f"train.max_steps={SAVED_AT + 2}"))
        assert "planned for updates of 4 units" in line and "does not divide it" in line
        return
    # Three ranks, 3 units each: 2 more updates of 9 units.
    three = trained(
        tmp_path / "three", 3, data, checkpoint, "train.batch_size=3", f"train.max_steps={SAVED_AT + 2}"
    )
    assert served_chunks(three, 3, range(SAVED_AT, SAVED_AT + 2)) == flat(units[position : position + 18])

    # Another seed plans another order: refused in one line that names the change.
    line = error_line(
        launch(tmp_path / "reseeded", 1, data, checkpoint, "seed=7", f"train.max_steps={SAVED_AT + 2}")
    )
    assert "(seed: 1234 -> 7), which plan another data order" in line
