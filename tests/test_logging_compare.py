"""W&B offline logging, CSV metrics (on disk at every log step, kept across kills and resumes), and
`pretrain compare` on runs and multiruns."""

from __future__ import annotations

import csv
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pretrain.config import load_config
from pretrain.report.compare import compare, find_runs
from pretrain.training.metrics_file import MetricsFile, join_steps, numeric_rows, read_table
from pretrain.training.run import train
from pretrain.training.run_record import load_run

REPO = Path(__file__).resolve().parents[1]
METRICS = {
    "train/loss",
    "train/tokens",
    "train/tokens_per_sec",
    "train/padding_waste",
    "train/pack_utilization",
    "train/num_targets",
    "val/loss",
    "lr",
}


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture()
def offline_env(tmp_path, monkeypatch, shared_cache):
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("PRETRAIN_CACHE_ROOT", str(shared_cache))
    return tmp_path


def _run(out: Path, *overrides: str) -> dict:
    cfg = load_config(
        ["experiment=smoke", f"output_dir={out}", "progress_bar=false", "train.max_steps=6", *overrides]
    )
    return train(cfg)


def test_csv_has_every_metric_and_tokens_are_cumulative_real_tokens(offline_env):
    out = offline_env / "run"
    summary = _run(out, "data=padded", "data.pad_to=max")
    with open(out / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert METRICS <= set(rows[0])
    tokens = [float(r["train/tokens"]) for r in rows if r["train/tokens"]]
    assert tokens == sorted(tokens) and tokens[-1] == summary["tokens"]
    waste = [float(r["train/padding_waste"]) for r in rows if r["train/padding_waste"]]
    # pydocs documents are mostly longer than 128 tokens, yet short ones leave padded rows.
    assert all(0.0 <= w < 1.0 for w in waste)
    num_targets = [float(r["train/num_targets"]) for r in rows if r["train/num_targets"]]
    # padded rows: real targets = per step tokens increment
    assert tokens[0] == num_targets[0]


def test_wandb_offline_run_logs_config_group_and_tags(offline_env):
    out = offline_env / "wb"
    _run(out, "logger=wandb", "experiment_name=smoke-wandb")
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((out / "wandb").iterdir()) if (out / "wandb").exists() else "no wandb dir"
    # Offline runs keep everything in the run's .wandb record file (synced later with `wandb sync`).
    records = next(runs[0].glob("*.wandb")).read_bytes()
    assert b"train/padding_waste" in records and b"val/loss" in records  # metrics
    assert b"policy:bestfit" in records and b"attn:sdpa" in records  # tags (the resolved backend)
    assert b"smoke-wandb" in records  # group (the experiment) and the resolved config


def test_compare_reads_runs_and_writes_plot_and_table(offline_env):
    a, b = offline_env / "sweep" / "0", offline_env / "sweep" / "1"
    _run(a, "data=padded")
    _run(b, "data=bestfit")
    assert find_runs([offline_env / "sweep"]) == [a, b]
    png = compare([offline_env / "sweep"], output=offline_env / "cmp.png", quiet=True)
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    arms, runs = (offline_env / "cmp.md").read_text().split("## runs\n\n")
    assert len(runs.splitlines()) == 4  # header, rule, two runs
    assert "reference: `padded`" in arms  # two arms of one seed each: the first is the reference
    assert "| bestfit | 1 |" in arms.split("### final val loss")[1]
    padded, bestfit = load_run(a), load_run(b)
    assert padded.policy == "padded" and bestfit.policy == "bestfit"
    assert padded.mean("train/padding_waste") > bestfit.mean("train/padding_waste") == 0.0


def test_compare_cli_errors_clearly_on_a_directory_without_runs(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pretrain.cli", "compare", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert proc.returncode == 2
    assert "no metrics.csv" in proc.stderr


def test_multirun_jobs_get_their_own_wandb_run_grouped_by_the_sweep(offline_env):
    sweep = offline_env / "outputs" / "multirun" / "day" / "sweepA"
    env = {k: v for k, v in os.environ.items()}
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            "--multirun",
            "experiment=smoke",
            "logger=wandb",
            "data=padded,bestfit",
            "train.max_steps=2",
            "progress_bar=false",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [next((sweep / job / "wandb").glob("offline-run-*/*.wandb")).read_bytes() for job in ("0", "1")]
    assert records[0] != records[1]  # one W&B run per job, not the first job's run reused
    for blob, policy in zip(records, ("padded", "bestfit"), strict=True):
        assert b"day/sweepA" in blob  # the group: the sweep directory
        assert f"policy:{policy}".encode() in blob
    # ... and the comparison reads the whole multirun.
    png = compare([sweep], quiet=True)
    assert png == (sweep / "compare.png").resolve() and png.exists()


# --- metrics.csv that survives kills and resumes ------------------------------------------------


def _file_steps(path: Path) -> list[int]:
    return [int(row["step"]) for row in read_table(path)[1]]


def test_metrics_file_appends_rows_and_rewrites_only_for_a_new_column(tmp_path):
    path = tmp_path / "metrics.csv"
    metrics = MetricsFile(path)
    assert metrics.start(0) is None and not path.exists()
    metrics.append([{"step": 1, "train/loss": 3.0}])
    metrics.append([{"step": 2, "train/loss": 2.5}])
    assert path.read_text() == "step,train/loss\n1,3.0\n2,2.5\n"
    inode = path.stat().st_ino
    metrics.append([{"step": 3, "train/loss": 2.0}])
    assert path.stat().st_ino == inode  # appended in place, not rewritten
    metrics.append([{"step": 4, "train/loss": 1.5, "val/loss": 1.75}])  # a new column: rewritten
    assert path.read_text() == "step,train/loss,val/loss\n1,3.0,\n2,2.5,\n3,2.0,\n4,1.5,1.75\n"
    # A kill in the middle of a write leaves a last line without its newline: it is not a row.
    with open(path, "a") as handle:
        handle.write("5,1.2")
    assert _file_steps(path) == [1, 2, 3, 4]
    resumed = MetricsFile(path)
    inode = path.stat().st_ino
    notice = resumed.start(3)
    assert path.stat().st_ino == inode  # the kept rows come first: the file is cut after them
    assert notice == (
        f"resuming after step 3: {path} keeps its 3 rows up to that step and drops 1 rows logged after "
        "it before the interruption (steps 4..4): those steps are trained again"
    )
    resumed.append([{"step": 4, "train/loss": 1.4, "val/loss": 1.7}])
    assert path.read_text() == "step,train/loss,val/loss\n1,3.0,\n2,2.5,\n3,2.0,\n4,1.4,1.7\n"
    assert MetricsFile(path).start(4) == (
        f"resuming after step 4: {path} keeps its 4 rows up to that step, new rows are appended"
    )
    fresh = MetricsFile(path)
    assert fresh.start(0) == (
        f"{path} held 4 rows of an earlier run; this run starts from step 0 (no checkpoint resumed), "
        "so its rows replace them"
    )
    assert not path.exists()


def test_a_resume_keeps_earlier_steps_wherever_they_are_in_the_file(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("step,train/loss\r\n1,3.0\r\n2,2.0\r\n5,0.5\r\n3,1.0\r\nx,9\r\n")
    assert "keeps its 3 rows up to that step and drops 2 rows" in (MetricsFile(path).start(3) or "")
    assert path.read_text() == "step,train/loss\n1,3.0\n2,2.0\n3,1.0\n"
    path.write_text("step,train/loss\r\n1,3.0\r\n2,2.0\r\n5,0.5\r\n")
    MetricsFile(path).start(2)
    assert path.read_bytes() == b"step,train/loss\r\n1,3.0\r\n2,2.0\r\n"  # cut after its first rows


def test_an_unreadable_metrics_file_is_moved_aside_not_appended_to(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_bytes(b"\xff\xfe\x00garbage")
    notice = MetricsFile(path).start(5)
    assert notice is not None and "moved it to" in notice and str(path) in notice
    assert (tmp_path / "metrics.unreadable.csv").read_bytes() == b"\xff\xfe\x00garbage"
    assert not path.exists()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(segments=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 12), st.booleans()), min_size=1))
def test_metrics_file_after_any_resumes_holds_each_step_once_in_order(tmp_path_factory, segments):
    """Each segment: a run that resumes from a step at or before the file's last one, logs some
    steps (sometimes with a new column), and is killed. The file always equals the last write of each
    step, in step order, and compare reads the same."""
    directory = tmp_path_factory.mktemp("metrics")
    path = directory / "metrics.csv"
    expected: dict[int, dict] = {}
    for back, count, validates in segments:
        last = max(expected, default=0)
        start = max(0, last - back)
        writer = MetricsFile(path)
        writer.start(start)
        expected = {step: row for step, row in expected.items() if step <= start}
        for step in range(start + 1, start + count + 1):
            row = {"step": step, "train/loss": float(step % 7) + len(expected) / 8, "train/tokens": 10 * step}
            if validates and step % 3 == 0:
                row["val/loss"] = step / 2
            writer.append([row])
            expected[step] = row
        if expected:
            rows = read_table(path)[1]
            assert [int(r["step"]) for r in rows] == sorted(expected)
            for r in rows:
                want = expected[int(r["step"])]
                assert float(r["train/loss"]) == want["train/loss"]
                assert (r.get("val/loss") or None) == (str(want["val/loss"]) if "val/loss" in want else None)
            assert [row["step"] for row in join_steps(numeric_rows(path, rows))] == sorted(expected)
        else:
            assert not path.exists()


def test_compare_joins_repeated_steps_and_files_last_write_wins(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    # An older layout: a first file, then a resume that re-logged steps 3..4 and went on to 6.
    (run / "metrics.1.csv").write_text(
        "step,train/loss,train/tokens\n1,5.0,10\n2,4.0,20\n3,3.9,30\n4,3.8,40\n"
    )
    (run / "metrics.csv").write_text(
        "step,train/loss,train/tokens,val/loss\n3,3.0,30,\n4,2.0,40,2.5\n4,1.9,40,\n5,1.5,50,\n6,1.0,60,1.2\n"
    )
    loaded = load_run(run)
    assert loaded.series["train/loss"] == [(10, 5.0), (20, 4.0), (30, 3.0), (40, 1.9), (50, 1.5), (60, 1.0)]
    assert loaded.series["val/loss"] == [(40, 2.5), (60, 1.2)]  # a step's cells are joined, later wins


def test_kill_9_mid_run_leaves_every_logged_step_in_metrics_csv(tmp_path, shared_cache):
    """A real `python train.py` logging every step, killed with SIGKILL once metrics.csv shows 4 steps."""
    run = tmp_path / "run"
    command = [
        sys.executable,
        "train.py",
        "experiment=smoke",
        "train.max_steps=100000",
        "train.log_every_n_steps=1",
        "train.val_every_n_steps=100000",
        "train.checkpoint_every_n_steps=100000",
        "progress_bar=false",
        f"hydra.run.dir={run}",
    ]
    env = {**os.environ, "PRETRAIN_CACHE_ROOT": str(shared_cache), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 300
        seen: list[int] = []
        while len(seen) < 4:
            assert process.poll() is None, process.stderr.read()[-3000:] if process.stderr else ""
            assert time.monotonic() < deadline, "the run logged fewer than 4 steps in 300 s"
            time.sleep(0.1)
            if (run / "metrics.csv").is_file():
                seen = _file_steps(run / "metrics.csv")
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGKILL
    steps = _file_steps(run / "metrics.csv")
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= len(seen) >= 4
    loaded = load_run(run)  # compare reads what the killed run left
    assert [tokens for tokens, _ in loaded.series["train/loss"]] == [512.0 * s for s in steps]


def test_resume_into_the_same_run_directory_appends_and_compare_draws_one_curve(offline_env, caplog):
    out = offline_env / "run"
    common = ["train.log_every_n_steps=1", "train.checkpoint_every_n_steps=2"]
    _run(out, *common, "train.max_steps=4")  # as if killed after logging step 4, its checkpoint at step 2
    before = (out / "metrics.csv").read_text().splitlines()
    assert _file_steps(out / "metrics.csv") == [1, 2, 3, 4]
    resume = f"ckpt_path={out / 'checkpoints' / 'step000002.ckpt'}"
    with caplog.at_level(logging.WARNING):
        summary = _run(out, *common, "train.max_steps=5", resume)
    notes = [r.getMessage() for r in caplog.records if "resuming after step" in r.getMessage()]
    assert notes == [
        f"resuming after step 2: {out / 'metrics.csv'} keeps its 2 rows up to that step and drops 2 rows "
        "logged after it before the interruption (steps 3..4): those steps are trained again"
    ]
    after = (out / "metrics.csv").read_text().splitlines()
    assert after[:3] == before[:3]  # the header and steps 1..2, untouched
    assert _file_steps(out / "metrics.csv") == [1, 2, 3, 4, 5] and summary["steps"] == 5
    loaded = load_run(out)
    tokens = [tokens for tokens, _ in loaded.series["train/loss"]]
    assert tokens == [512.0 * step for step in range(1, 6)]  # one continuous curve
    png = compare([out], output=offline_env / "resumed.png", quiet=True)
    assert png.read_bytes()[:4] == b"\x89PNG"
