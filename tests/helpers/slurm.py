"""A real Slurm for the tests (scripts/slurm_local.sh starts a single-node one): whether it runs jobs,
and sbatch / scontrol / scancel as the tests use them.

Without a working Slurm the tests that need it are skipped with the reason; with PRETRAIN_REQUIRE_SLURM=1
(.ci/run sets it after starting Slurm) they fail instead, so a broken install cannot pass CI unseen."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .env import REPO

REQUIRE_ENV = "PRETRAIN_REQUIRE_SLURM"
START = "scripts/slurm_local.sh start"
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}


def slurm_unavailable() -> str | None:
    """Why no job can run here (None: a task runs)."""
    if shutil.which("srun") is None or shutil.which("sbatch") is None:
        return f"Slurm is not installed (no srun/sbatch on PATH): {START}"
    check = ["srun", "--quiet", "--ntasks=1", "--time=1", "--job-name=pretrain-tests-check", "true"]
    try:
        proc = subprocess.run(check, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return f"srun did not run a task within 60 s (no slurmctld/slurmd?): {START}"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return f"srun cannot run a task ({last}): {START}"
    return None


def submitit_missing() -> str | None:
    try:
        import hydra_plugins.hydra_submitit_launcher  # noqa: F401
    except ImportError:
        return "hydra-submitit-launcher is not installed: pip install -e '.[slurm]' (make install does)"
    return None


def skip_or_fail(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"Slurm is required here ({REQUIRE_ENV}=1) but {reason}", pytrace=False)
    pytest.skip(reason)


def job_env(**extra: str) -> dict[str, str]:
    """The environment a job inherits (sbatch --export=ALL): the test's (offline, the cache root), this
    checkout's src/ and interpreter (train.sbatch's PYTHON), no enclosing job's SLURM_* variables."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    env["PYTHON"] = sys.executable
    return env | extra


class Jobs:
    """The jobs a test submits; those still queued or running at its end are cancelled."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def sbatch(self, script: Path, *args: str, workdir: Path, options: tuple[str, ...] = ()) -> str:
        """Submit from the project directory (train.sbatch runs its train.py) to work in `workdir`."""
        workdir.mkdir(parents=True, exist_ok=True)
        cmd = ["sbatch", "--parsable", f"--chdir={workdir}", *options, str(script), *args]
        proc = subprocess.run(cmd, cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        job = proc.stdout.strip().split(";")[0]
        self.ids.append(job)
        return job

    def cancel_all(self) -> None:
        if self.ids:
            subprocess.run(["scancel", *self.ids], capture_output=True, timeout=60)


def job_info(job: str) -> dict[str, str]:
    """`scontrol show job` as a dict (JobState, ExitCode, Restarts, StdOut, ...)."""
    out = subprocess.run(
        ["scontrol", "show", "job", "--oneliner", job], capture_output=True, text=True, timeout=60
    ).stdout
    return dict(re.findall(r"(\w[\w:/]*)=(\S*)", out))


def wait_until(job: str, states: set[str], timeout: float = 600) -> dict[str, str]:
    """Poll until the job is in one of `states`; fails with its log's tail when it ends elsewhere."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = job_info(job)
        state = info.get("JobState")
        if state in states:
            return info
        if state in FINAL_STATES:
            raise AssertionError(f"job {job} ended {state} ({info.get('ExitCode')}):\n{log_tail(info)}")
        time.sleep(1)
    raise AssertionError(f"job {job} not {states} within {timeout} s:\n{log_tail(job_info(job))}")


def log_tail(info: dict[str, str], lines: int = 40) -> str:
    try:
        return "\n".join(Path(info["StdOut"]).read_text().splitlines()[-lines:])
    except (KeyError, OSError):
        return "(no log)"


def wait_for_line(path: Path, prefix: str, job: str, timeout: float = 600) -> None:
    """Until a line of `path` (a job's log) starts with `prefix`: a progress line, e.g. `step 2/`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and any(line.startswith(prefix) for line in path.read_text().splitlines()):
            return
        state = job_info(job).get("JobState")
        if state in FINAL_STATES:
            raise AssertionError(f"job {job} ended {state} before {prefix!r}:\n{log_tail(job_info(job))}")
        time.sleep(0.2)
    raise AssertionError(f"no line {prefix!r} in {path} within {timeout} s")


def signal_job(job: str, name: str) -> None:
    """What Slurm does at preemption or before the time limit (--signal): the signal to every task."""
    subprocess.run(["scancel", f"--signal={name}", job], check=True, timeout=60)


def requeue(job: str) -> None:
    """`scontrol requeue`, as a scheduler requeues a preempted job."""
    subprocess.run(["scontrol", "requeue", job], check=True, timeout=60)


def release(job: str) -> None:
    """A requeued job waits ~2 min (Reason=BeginTime) before it may start: start it now, or rather 2 s
    after its end (slurmd revokes the ended job's credential to the second: a start within the same
    second is killed as "Job credential revoked")."""
    deadline = time.monotonic() + 60
    while job_info(job).get("JobState") != "PENDING":
        assert time.monotonic() < deadline, job_info(job)
        time.sleep(0.5)
    time.sleep(2)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, timeout=60)
