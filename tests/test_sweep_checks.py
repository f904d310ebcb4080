"""A multirun is checked like a single run, job by job, before Hydra makes its sweep directory: the
jobs are expanded as Hydra's basic sweeper expands them (comma lists, an experiment's
hydra.sweeper.params), a refused job is one line with exit 2 naming the job, and no job starts."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pretrain.cli.sweep import sweep_jobs
from pretrain.errors import hide_schema_options

REPO = Path(__file__).resolve().parents[1]


def _train_module():
    spec = importlib.util.spec_from_file_location("train_entry", REPO / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train_py(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, "train.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def test_comma_lists_expand_in_hydras_order():
    jobs = sweep_jobs(["experiment=smoke", "data=padded,bestfit", "train.batch_size=2,4"])
    assert jobs is not None
    assert [job.swept for job in jobs] == [
        ["data=padded", "train.batch_size=2"],
        ["data=padded", "train.batch_size=4"],
        ["data=bestfit", "train.batch_size=2"],
        ["data=bestfit", "train.batch_size=4"],
    ]
    assert [job.number for job in jobs] == [0, 1, 2, 3]
    assert jobs[3].overrides == ["experiment=smoke", "data=bestfit", "train.batch_size=4"]
    assert jobs[1].label() == "sweep job 1 (data=padded train.batch_size=4)"


def test_an_experiments_sweeper_params_are_expanded_and_the_command_line_wins():
    jobs = sweep_jobs(["experiment=composition_study"])
    assert jobs is not None and len(jobs) == 24  # 3 seeds x 8 arms
    assert jobs[0].swept == ["seed=0", "study_arm=padded"]
    assert jobs[-1].swept == ["seed=2", "study_arm=vsl"]
    jobs = sweep_jobs(["experiment=composition_study", "seed=7"])  # one seed: 8 jobs
    assert jobs is not None and len(jobs) == 8
    assert all("seed=7" in job.overrides for job in jobs)


def test_a_valid_sweep_passes_the_checks():
    train = _train_module()
    train.check_overrides(  # the demo's own command line (make train): no SystemExit
        [
            "--multirun",
            "experiment=demo",
            "data=padded,bestfit",
            "hydra.sweep.dir=x",
            "hydra.sweep.subdir=${data.policy}",
        ]
    )


def test_a_refused_job_is_one_line_exit_2_and_no_sweep_directory(tmp_path):
    cases = {
        ("-m", "experiment=smoke", "train.lr=1e-3,-1"): (
            "error: sweep job 1 (train.lr=-1): train.lr=-1.0 must be > 0; no job was started"
        ),
        ("--multirun", "experiment=smoke", "data=padded,bestfitt"): (
            "error: sweep job 1 (data=bestfitt): data=bestfitt: no such option; choose one of "
            "bestfit, firstfit, padded, prepacked, vsl; no job was started"
        ),
        ("-m", "train.batch_sizee=2,4"): "error: sweep job 0 (train.batch_sizee=2): Could not override",
        ("-m", "experiment=composition_study", "seed=1", "attn=flex"): (
            "error: sweep job 0 (seed=1 study_arm=padded): attn=flex cannot train on CPU"
        ),
    }
    for args, says in cases.items():
        sweep_dir = tmp_path / "sweep"
        proc = _train_py(*args, f"hydra.sweep.dir={sweep_dir}")
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (args, proc.stderr[-2000:])
        assert len(lines) == 1 and lines[0].startswith(says), (args, lines)
        assert "_schema" not in lines[0]
        assert not sweep_dir.exists()


def test_help_hides_the_schema_options():
    proc = _train_py("--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "data: bestfit, firstfit, padded, prepacked, vsl" in proc.stdout
    assert "_schema" not in proc.stdout


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("data: bestfit, bestfit_schema, padded, padded_schema", "data: bestfit, padded"),
        ("attn: auto, sdpa", "attn: auto, sdpa"),
        ("  kind: pydocs", "  kind: pydocs"),
    ],
)
def test_hide_schema_options(line, shown):
    assert hide_schema_options(line) == shown
