"""The cluster path on a real Slurm (scripts/slurm_local.sh starts a single-node one; tests/helpers/slurm.py):
jobs submitted with the project's scripts/slurm/train.sbatch and through hydra/launcher=slurm.

- DDP from srun: 2 tasks, 2 gloo ranks whose ranks come from Slurm, disjoint packs, the same records and
  losses as the same run launched without Slurm;
- preemption: SIGTERM (scancel --signal, as Slurm preempts) or SIGUSR1 (the --signal Slurm sends before
  the time limit) reaches every rank, the run saves at the update boundary, the job is requeued
  (scontrol requeue, or train.sbatch itself on SIGUSR1), resumes with ckpt_path=auto and ends with the
  uninterrupted run's losses; requeued with 1 task instead of 2 it continues the global order exactly;
- one run directory per job (outputs/slurm-<job id>/) and one log (slurm-<job id>.out), requeued or not;
- a 2x2 sweep through hydra-submitit-launcher, read by `pretrain compare`, and submitit's own
  time-limit signal (SIGUSR2): the checkpoint at the update, then submitit's requeue.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import SHARED_CACHE, module_cache_root
from helpers.slurm import (
    Jobs,
    job_env,
    release,
    requeue,
    signal_job,
    skip_or_fail,
    submitit_missing,
    wait_for_line,
    wait_until,
)

REPO = Path(__file__).resolve().parents[1]
SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"
STEPS = 30  # enough updates that a signal sent at update 2 lands before the last, also on a fast machine
TINY = [
    "experiment=smoke",
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "data.max_seq_len=64",
    "train.batch_size=2",
    "train.warmup_steps=1",
    "train.val_every_n_steps=100",
    "train.val_batches=1",
    "train.eval_microbatch_tokens=256",
    "train.deterministic=true",
    "train.checkpoint_every_n_steps=100",  # no periodic checkpoint: a resume starts from the preemption's
    "record_batches=true",
    "progress_bar=true",  # a plain line per update in the log: `step 2/20 | ...`
    "logger=csv",
    f"train.max_steps={STEPS}",
]
DDP = [*TINY, "trainer=ddp", "trainer.accelerator=cpu", "trainer.precision=32-true"]
TWO_TASKS = ("--ntasks-per-node=2", "--mem-per-cpu=2G")

cache_root = module_cache_root(SHARED_CACHE)


def losses(run: Path) -> dict[int, float]:
    with open(run / "metrics.csv", newline="") as handle:
        return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(handle) if r["train/loss"]}


def records(run: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (run / f"batches.rank{rank}.jsonl").read_text().splitlines()]


def global_order(run: Path, ranks: int, steps: int = STEPS) -> list[int]:
    """The chunks the ranks trained in the first `steps` updates, in global batch order: update,
    microbatch, then rank."""
    by_rank = [{r["step"]: r for r in records(run, rank)} for rank in range(ranks)]
    out: list[int] = []
    for step in range(steps):
        for j in range(len(by_rank[0][step]["chunks"])):
            for rank in range(ranks):
                out += by_rank[rank][step]["chunks"][j]
    return out


def first_submitit_log(sweep: Path, submitter: subprocess.Popen, timeout: float = 300) -> Path:
    """The first sweep job's stdout log, <sweep dir>/.submitit/<job id>/<job id>_0_log.out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and submitter.poll() is None:
        logs = sorted((sweep / ".submitit").glob("*/*_0_log.out"))
        if logs:
            return logs[0]
        time.sleep(0.5)
    raise AssertionError(f"no submitit job log under {sweep} within {timeout} s")


def saved_step(checkpoint: Path) -> int:
    return int(torch.load(checkpoint, map_location="cpu", weights_only=False)["global_step"])


def the_run_dir(workdir: Path, job: str) -> Path:
    """The job's one run directory: outputs/slurm-<job id>, and nothing else under outputs/."""
    assert sorted(p.name for p in (workdir / "outputs").iterdir()) == [f"slurm-{job}"]
    return workdir / "outputs" / f"slurm-{job}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cache_root, slurm_cluster) -> Path:
    """The reference: 2 tasks of train.sbatch, STEPS updates without a signal."""
    jobs = Jobs()
    workdir = tmp_path_factory.mktemp("uninterrupted")
    try:
        job = jobs.sbatch(SBATCH, *DDP, workdir=workdir, options=TWO_TASKS)
        info = wait_until(job, {"COMPLETED"})
    finally:
        jobs.cancel_all()
    assert info["NumTasks"] == "2" and info["Restarts"] == "0"
    return the_run_dir(workdir, job)


def test_ddp_from_srun_gives_each_task_its_rank_and_trains_as_without_slurm(uninterrupted, tmp_path):
    run = uninterrupted
    log = (run.parent.parent / f"{run.name}.out").read_text()  # slurm-<job id>.out beside outputs/
    # Two srun tasks, each a rank of its own (Lightning's SLURM environment: nothing spawned).
    assert "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2" in log
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in log
    assert "1 node(s) x 2 task(s)" in log
    ranks = [records(run, rank) for rank in (0, 1)]
    assert [[r["rank"] for r in rank] for rank in ranks] == [[0] * STEPS, [1] * STEPS]
    served = [[c for r in rank for batch in r["chunks"] for c in batch] for rank in ranks]
    assert not set(served[0]) & set(served[1])  # disjoint packs
    assert len(set(served[0] + served[1])) == len(served[0] + served[1])  # no chunk twice in the epoch

    # The same run launched without Slurm (Lightning starts rank 1 itself): the same batches and losses.
    local = tmp_path / "local"
    cmd = [sys.executable, "train.py", *DDP, "trainer.devices=2", f"hydra.run.dir={local}"]
    proc = subprocess.run(cmd, cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert records(local, rank) == records(run, rank)
    assert losses(local) == losses(run) and len(losses(run)) == STEPS


def test_sigterm_saves_at_the_update_and_the_requeued_job_ends_as_the_uninterrupted_one(
    uninterrupted, slurm_jobs, tmp_path
):
    job = slurm_jobs.sbatch(SBATCH, *DDP, workdir=tmp_path, options=TWO_TASKS)
    log = tmp_path / f"slurm-{job}.out"
    wait_for_line(log, "step 2/", job)
    signal_job(job, "TERM")  # Slurm's preemption signal, to every task
    info = wait_until(job, {"FAILED"})
    assert info["ExitCode"] == "143:0", log.read_text()[-3000:]
    run = the_run_dir(tmp_path, job)
    report = json.loads((run / "run.json").read_text())
    assert report["status"] == "preempted" and report["signal"] == "SIGTERM"
    stopped = report["steps"]
    assert 2 <= stopped < STEPS and saved_step(run / "checkpoints" / "last.ckpt") == stopped
    assert len(records(run, 0)) == len(records(run, 1)) == stopped  # both ranks stopped after that update

    requeue(job)  # as the scheduler requeues a preempted job
    release(job)
    info = wait_until(job, {"COMPLETED"})
    assert info["Restarts"] == "1"
    assert the_run_dir(tmp_path, job) == run  # the requeued job's run is the same run
    text = log.read_text()  # one log for the job, both starts in it
    assert "received SIGTERM: stopping after the current update" in text
    assert "(restart 1)" in text and f"ckpt_path=auto: resuming from {run / 'checkpoints'}" in text
    assert Path(info["StdOut"]) == log
    for rank in (0, 1):
        assert records(run, rank) == records(uninterrupted, rank)  # no update skipped or repeated
    assert losses(run) == losses(uninterrupted)  # bitwise: model, optimizer, schedule, data


def test_the_time_limit_signal_requeues_and_one_task_continues_the_global_order(
    uninterrupted, slurm_jobs, tmp_path
):
    # train.sbatch as it is, except that its restart runs 1 task instead of 2 (in the same allocation).
    script = SBATCH.read_text()
    line = "tasks=${SLURM_NTASKS_PER_NODE:-1}\n"
    assert line in script
    smaller = tmp_path / "smaller.sbatch"
    smaller.write_text(script.replace(line, line + '[ "${SLURM_RESTART_COUNT:-0}" = 0 ] || tasks=1\n'))
    job = slurm_jobs.sbatch(smaller, *DDP, workdir=tmp_path, options=TWO_TASKS)
    log = tmp_path / f"slurm-{job}.out"
    wait_for_line(log, "step 2/", job)
    signal_job(job, "USR1")  # what --signal=USR1@120 sends before the time limit
    release(job)  # train.sbatch requeued the job itself (exit 138)
    info = wait_until(job, {"COMPLETED"})
    assert info["Restarts"] == "1"
    run = the_run_dir(tmp_path, job)
    text = log.read_text()
    assert "received SIGUSR1: stopping after the current update" in text
    assert f"pretrain: requeueing job {job}" in text and "1 node(s) x 1 task(s)" in text

    stopped = len(records(run, 1))  # rank 1 trained only before the requeue
    assert 2 <= stopped < STEPS
    assert [r["step"] for r in records(run, 0)] == list(range(STEPS))
    before = global_order(run, 2, stopped)  # the 2 ranks' updates
    reference = global_order(uninterrupted, 2)
    assert before == reference[: len(before)]
    after = [c for r in records(run, 0)[stopped:] for batch in r["chunks"] for c in batch]
    assert after and len(before) + len(after) <= len(reference)
    assert after == reference[len(before) : len(before) + len(after)]  # the global order, continued


def test_a_sweep_through_hydra_launcher_slurm_trains_every_job_and_compare_reads_them(
    slurm_jobs, tmp_path, cache_root
):
    missing = submitit_missing()
    if missing:
        skip_or_fail(missing)
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "train.py", "--multirun", "hydra/launcher=slurm", "trainer=cpu", *TINY]
    cmd += ["train.max_steps=4", "train.val_every_n_steps=2", "data=padded,bestfit", "train.batch_size=2,4"]
    cmd += [f"hydra.sweep.dir={sweep}", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1"]
    cmd += ["hydra.launcher.timeout_min=10"]
    proc = subprocess.run(cmd, cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted(p.name for p in (sweep / ".submitit").iterdir() if p.is_dir() and "_" in p.name)
    assert len(jobs) == 4  # one array task per sweep job, each with its log
    for number in range(4):
        report = json.loads((sweep / str(number) / "run.json").read_text())
        assert report["status"] == "completed" and report["steps"] == 4
        assert (sweep / str(number) / "checkpoints" / "last.ckpt").is_file()
    logs = "".join((sweep / ".submitit" / job / f"{job}_0_log.out").read_text() for job in jobs)
    assert logs.count("done: 4 steps") == 4
    compare = subprocess.run(
        [sys.executable, "-m", "pretrain.cli", "compare", str(sweep), "--output", str(tmp_path / "c.png")],
        cwd=REPO,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert compare.returncode == 0, compare.stderr[-3000:]
    assert "bestfit - padded, final val loss per cell of batch_size" in compare.stdout  # matched contrasts
    table = (tmp_path / "c.md").read_text()  # compare prints one screen; the tables go to the file
    for arm in ("padded batch_size=2", "padded batch_size=4", "bestfit batch_size=2", "bestfit batch_size=4"):
        assert f"| {arm} |" in table


def test_submitit_time_limit_signal_checkpoints_at_the_update_before_submitit_requeues(
    slurm_jobs, tmp_path, cache_root
):
    missing = submitit_missing()
    if missing:
        skip_or_fail(missing)
    one = ["trainer=cpu", *TINY, "ckpt_path=auto"]
    full = tmp_path / "full"
    proc = subprocess.run(
        [sys.executable, "train.py", *one, f"hydra.run.dir={full}"],
        cwd=REPO,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "train.py", "--multirun", "hydra/launcher=slurm", *one]
    cmd += [f"hydra.sweep.dir={sweep}", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1"]
    cmd += ["hydra.launcher.timeout_min=10"]
    submitter = subprocess.Popen(
        cmd, cwd=REPO, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        log = first_submitit_log(sweep, submitter)
        job = log.parent.name
        slurm_jobs.ids.append(job)
        wait_for_line(log, "step 2/", job)
        signal_job(job, "USR2")  # submitit's --signal before the time limit
        release(job)  # submitit requeued it
        out, _ = submitter.communicate(timeout=600)
    finally:
        if submitter.poll() is None:
            submitter.kill()
    assert submitter.returncode == 0, out[-3000:]
    text = log.read_text() + log.with_suffix(".err").read_text()  # submitit's stdout and stderr
    assert "received SIGUSR2: stopping after the current update" in text
    assert "passing SIGUSR2 on to the launcher" in text and f"Requeued job {job}" in text
    assert "ckpt_path=auto: resuming from" in text
    run = sweep / "0"
    assert json.loads((run / "run.json").read_text())["status"] == "completed"
    assert records(run, 0) == records(full, 0) and losses(run) == losses(full)
