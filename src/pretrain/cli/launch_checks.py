"""What `python train.py` checks before Hydra writes anything: the config (a bad override, an unknown
key or option, a value out of range), the device and attention backend this machine has, the sources'
keys, and the run directory (creatable; an existing one locked, and not another run's checkpoints
replaced). A refusal is one `error:` line with exit 2, and no run directory is made.

A single run is checked on the config Hydra composed for it: `CheckBeforeRun` is a Hydra callback
(conf/train.yaml's `hydra.callbacks`) whose `on_run_start` runs after Hydra's composition and before
`run_job` makes the directory. It builds the run's settings there (`RunSettings.before_run_dir`: the
tokenizer files read, `model.init_from` and `ckpt_path` checked), so their refusals too come before
anything is made, and hands them on to the job (`checked_config`): a run composes and types its config
once (each composition is ~0.1 s of start-up; bench_fixed_costs.py). Should Hydra fail to write the
directory's `.hydra/` (a full disk), `report_run_dir_write` says so in one line and removes what the
run made.
A multirun (`-m`/`--multirun`) is checked by `check_overrides` for every job's config (sweep.py
expands it as Hydra would) before Hydra makes the sweep directory: no job starts when any job would be
refused. `check_overrides` also checks a single run's command line without Hydra (tests, and the
report of a composition error, which has no config to hand the callback).

A launch that passes says what would waste it, once (a sweep: one line for all its jobs): a run that
would validate fewer than twice (`warning: train.val_every_n_steps=...`), and a machine whose CPUs
are busy with other work (`note: this machine's load is ...`: its times are not the README's).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from ..config import Config, TrainConfig, auto_val_every
from ..errors import WriteError, exit_on_user_error
from ..training import machine_load

if TYPE_CHECKING:
    from ..training.startup import RunSettings
    from .sweep import Job

MULTIRUN_FLAGS = ("-m", "--multirun")
MIN_VALIDATIONS = 2
"""A run validating fewer times has no val-loss curve, and compare no val loss at equal tokens."""
_SAID: set[str] = set()  # the launch's warnings and notes said in this process

_checked: Config | RunSettings | None = None  # the single run's, from on_run_start to its job
_job_started = False  # Hydra has written the run directory's .hydra/ and called the job


class CheckBeforeRun(Callback):
    """Hydra's `on_run_start` (a single run; after composition, before its directory): the checks."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _checked
        try:
            given = config.hydra.overrides  # the command line, hydra.* apart from the job's own
            job = OmegaConf.masked_copy(config, [str(key) for key in config if key != "hydra"])
            with exit_on_user_error():
                _checked = check_single_run(job, [*given.hydra, *given.task], settle=True)
        except Exception:  # Hydra would make it a warning and run the job: a bug stops the run here
            traceback.print_exc()
            raise SystemExit(1) from None

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _job_started
        _job_started = True


def checked_config(cfg: DictConfig) -> DictConfig | Config | RunSettings:
    """The job's config, typed once: the settings `CheckBeforeRun` built, else `cfg` as Hydra gives it."""
    global _checked
    typed, _checked = _checked, None
    return typed if typed is not None else cfg


def check_single_run(cfg: DictConfig, overrides: list[str], settle: bool = False) -> Config | RunSettings:
    """Every check of one run on its composed config; returns it typed, or (`settle`: train.py's
    callback) the run's settings, built before the run directory is locked (made)."""
    from ..config import check_choices, check_known_keys, to_config

    check_choices(cfg)
    check_known_keys(cfg)
    config = to_config(cfg)
    directory = check_run_dir(overrides)
    check_job(config)
    checked: Config | RunSettings = config
    if settle:
        from ..training.startup import RunSettings

        checked = RunSettings.before_run_dir(config)
    note_new_outputs(overrides)
    if directory is not None:
        lock_run_dir(directory, config)
    say_launch_notes([config.train])
    return checked


def report_run_dir_write(error: OSError) -> None:
    """An OSError out of a single run before its job started is Hydra's, writing the run directory's
    `.hydra/` (a full disk): one `error:` line, exit 2, and the directory left as the run found it.
    Returns for anything else (the job's own error keeps its traceback)."""
    from ..training.rundir import remove_refused_run, this_run_dir

    directory = this_run_dir()
    if _job_started or directory is None:
        return
    import errno

    remove_refused_run(directory)
    free = "free disk space or " if error.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    with exit_on_user_error():
        raise WriteError(
            f"cannot write the run directory {directory}: {error.strerror or error}; {free}run elsewhere "
            "with hydra.run.dir=DIR"
        ) from None


def check_overrides(argv: list[str]) -> None:
    """The checks of `python train.py argv` composed here: a single run's (as `CheckBeforeRun` does
    them), or every job's of a multirun. Hydra's other flags (--cfg, --info, ...) are Hydra's."""
    multirun = any(arg in MULTIRUN_FLAGS for arg in argv)
    overrides = [arg for arg in argv if arg not in MULTIRUN_FLAGS]
    if any(arg.startswith("-") for arg in overrides):
        return
    from ..config import load_config, to_config

    with exit_on_user_error():
        if not multirun:
            check_single_run(load_config(overrides), overrides)
            return
        from .sweep import check_jobs, sweep_jobs

        jobs = sweep_jobs(overrides)
        if jobs is None:  # another sweeper than the basic one: its jobs are its own
            return
        check_run_dir(overrides, multirun=True)
        configs = check_jobs(jobs, lambda cfg: check_job(to_config(cfg)))
        note_new_outputs(overrides)
        say_launch_notes([config.train for config in configs], jobs)


def check_job(config: Config) -> Config:
    """The device and attention backend the run asks for exist here (trainer=gpu without CUDA, flex
    training on CPU, varlen without CUDA bf16), refused before Lightning is imported; a mixture's
    policy and every source's keys (nothing hashed); the task's source (task=sft: conversations);
    eval.downstream's tasks. Returns `config`."""
    from ..data.batching.mixture import check_sources
    from ..data.ingest.chat import check_task
    from ..downstream.after_training import check_downstream
    from ..training.checks import attention_backend

    attention_backend(config.attn, config.trainer)
    check_sources(config)
    check_task(config, config.source)
    check_downstream(config)
    return config


def say_launch_notes(trains: Sequence[TrainConfig], jobs: Sequence[Job] | None = None) -> None:
    """What would waste a launch that passed its checks, once per process on rank 0 (a failed run's
    report composes its command line again): too few validations (a sweep's `trains` are its `jobs`'),
    and a busy machine. The load is read from `machine_load.load_per_cpu` when this runs."""
    from ..training.rundir import is_rank_zero

    said = few_validations_warning(trains, jobs), busy_machine_note(machine_load.load_per_cpu())
    for line in said:
        if line is not None and line not in _SAID and is_rank_zero():
            _SAID.add(line)
            print(line, file=sys.stderr, flush=True)


def few_validations_warning(trains: Sequence[TrainConfig], jobs: Sequence[Job] | None = None) -> str | None:
    """One line when a run, or any job of a sweep (`jobs`, in the order of `trains`), would validate
    fewer than MIN_VALIDATIONS times (at every multiple of train.val_every_n_steps up to
    train.max_steps, and at max_steps): the runs concerned, and a value that fits them all."""
    few = [
        i
        for i, train in enumerate(trains)
        if train.max_steps >= MIN_VALIDATIONS and train.validations < MIN_VALIDATIONS
    ]
    if not few:
        return None
    every = sorted({trains[i].val_every for i in few})
    steps = sorted({trains[i].max_steps for i in few})
    where = ""
    if jobs is not None:
        named = [f"{jobs[i].number} ({' '.join(jobs[i].swept) or 'no swept keys'})" for i in few]
        where = (
            f"all {len(jobs)} sweep jobs: " if len(few) == len(jobs) else f"sweep jobs {', '.join(named)}: "
        )
    auto = f" (validates every {auto_val_every(steps[0])} steps here)" if len(steps) == 1 else ""
    return (
        f"warning: {where}train.val_every_n_steps={' or '.join(map(str, every))} with "
        f"train.max_steps={' or '.join(map(str, steps))} validates once (at the last step): val-loss "
        f"curves and compare's equal-token row need >= {MIN_VALIDATIONS}; use "
        f"train.val_every_n_steps=auto{auto} or a value <= {steps[0] // MIN_VALIDATIONS}"
    )


def busy_machine_note(load_per_cpu: float | None) -> str | None:
    """One line when the machine's load per CPU is above machine_load.CONTENDED: the run's times will
    be about that many times the README's, which were measured on idle cores."""
    if load_per_cpu is None or not load_per_cpu > machine_load.CONTENDED:
        return None
    return (
        f"note: this machine's load is {load_per_cpu:.1f} per CPU (above {machine_load.CONTENDED}): "
        f"runs take about {max(2, round(load_per_cpu))}x the README's times, which are for idle cores"
    )


def lock_run_dir(directory: Path, config: Config) -> None:
    """An existing run directory (hydra.run.dir=DIR, a SLURM job's) is locked before Hydra writes its
    `.hydra/` files and train.log into it, and a fresh run there must not replace another run's
    checkpoints: a refused run leaves the live run's files as they were."""
    from ..errors import PretrainError
    from ..training.rundir import check_fresh_start, hold_run_dir, is_rank_zero, remove_refused_run

    if not is_rank_zero():  # the other ranks are rank 0's own job
        return
    hold_run_dir(directory)  # held until the process ends; the run's own lock shares it
    try:
        check_fresh_start(directory, config.ckpt_path, config.start_over)
    except PretrainError:
        remove_refused_run(directory)  # the lock file, or the directory the lock made
        raise


def note_new_outputs(argv: list[str]) -> None:
    """Runs go under ./outputs of the working directory: one line when that folder is new (a run
    started from another directory than the project's), so its runs are not looked for in vain."""
    if (
        any(arg.startswith(("hydra.run.dir=", "hydra.sweep.dir=")) for arg in argv)
        or Path("outputs").exists()
    ):
        return
    print(
        f"note: new outputs/ folder in {Path.cwd()} (runs go under the working directory); "
        "run from the project to keep its runs together, or set hydra.run.dir=DIR",
        file=sys.stderr,
    )


def _override_value(override: str) -> str:
    """The value of `key=value` as Hydra reads it (quotes and escapes as its grammar has them)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        (parsed,) = OverridesParser.create().parse_overrides([override])
        return str(parsed.value())
    except Exception:  # Hydra itself reports a malformed override, in one line
        return override.split("=", 1)[1].strip("'\"")


def check_run_dir(argv: list[str], multirun: bool = False) -> Path | None:
    """The run directory (hydra.run.dir, a multirun's hydra.sweep.dir, else under ./outputs) must be
    creatable: refused in one line here rather than as Hydra's traceback when it makes the directory.
    Returns a single run's directory when it is known before Hydra resolves it (hydra.run.dir=DIR, a
    SLURM job's), else None (a new one, or a sweep's)."""
    from ..training.rundir import slurm_job_id

    key = "hydra.sweep.dir=" if multirun else "hydra.run.dir="
    given = [_override_value(arg) for arg in argv if arg.startswith(key)]
    explicit = bool(given) and "${" not in given[-1]
    job = slurm_job_id()
    known = Path(given[-1]) if explicit else Path("outputs") / f"slurm-{job}" if job and not given else None
    target = Path(given[-1]) if explicit else Path("outputs")
    existing = target.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise WriteError(
            f"cannot create the run directory {target}: {existing} is not a writable folder; "
            f"run elsewhere with {key}DIR"
        )
    failed = _cannot_write_in(existing)  # root passes os.access on /sys; a full disk passes it too
    if failed is not None:
        import errno

        free = "free disk space or " if failed.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        raise WriteError(
            f"cannot create the run directory {target}: cannot write in {existing} "
            f"({failed.strerror or failed}); {free}run elsewhere with {key}DIR"
        )
    return None if multirun else known


def _cannot_write_in(folder: Path) -> OSError | None:
    """The error a file of Hydra's config's size meets in `folder` (None: it can be written): tried,
    then removed, so a full disk or a pseudo file system is one line here, not Hydra's traceback."""
    probe = folder / f".write-test-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as error:
        return error
    try:
        os.write(fd, b"\0" * 16384)
        os.fsync(fd)
    except OSError as error:
        return error
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
    return None
