"""Train a GPT on the token cache: python train.py [Hydra overrides], e.g. data=padded attn=sdpa."""

import sys

try:
    from pretrain.fast_exit import exit_now
    from pretrain.training.preemption import Interrupted, install_early
except ModuleNotFoundError as missing:  # run outside the project's environment: say how to enter it
    print(
        f"error: cannot import {missing.name!r} ({missing}): run inside the project's environment, "
        "`source .venv/bin/activate` (after `make install`), or `make train`",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

MULTIRUN_FLAGS = ("-m", "--multirun")
HELP_FLAGS = ("-h", "--help")


def check_overrides(argv: list[str]) -> None:
    """Compose and type-check the overrides before Hydra starts: a bad override, an unknown key or
    option, a value out of range, or a device or attention backend this machine lacks is one `error:`
    line with exit 2, and no run directory is made. A multirun (`-m`/`--multirun`) gets the same checks
    for every job's config (sweep.py expands it as Hydra would) before Hydra makes the sweep directory:
    no job starts when any job would be refused. (Hydra's other flags, --cfg, --info, ..., are Hydra's.)"""
    multirun = any(arg in MULTIRUN_FLAGS for arg in argv)
    overrides = [arg for arg in argv if arg not in MULTIRUN_FLAGS]
    if any(arg.startswith("-") for arg in overrides):
        return
    from pretrain.config import load_config, to_config
    from pretrain.data.mixture import check_sources
    from pretrain.errors import exit_on_user_error

    def check_job(config) -> None:
        check_device(config)
        check_sources(config)  # a mixture's policy and every source's keys (nothing hashed)

    with exit_on_user_error():
        if not multirun:
            config = to_config(load_config(overrides))
            directory = check_run_dir(overrides)
            check_job(config)
            note_new_outputs(overrides)
            if directory is not None:
                lock_run_dir(directory, config)
            return
        from pretrain.sweep import check_jobs, sweep_jobs

        jobs = sweep_jobs(overrides)
        if jobs is None:  # another sweeper than the basic one: its jobs are its own
            return
        check_run_dir(overrides, multirun=True)
        check_jobs(jobs, lambda cfg: check_job(to_config(cfg)))
        note_new_outputs(overrides)


def lock_run_dir(directory, config) -> None:
    """An existing run directory (hydra.run.dir=DIR, a SLURM job's) is locked before Hydra writes its
    `.hydra/` files and train.log into it, and a fresh run there must not replace another run's
    checkpoints: a refused run leaves the live run's files as they were."""
    from pretrain.training.rundir import check_fresh_start, hold_run_dir, is_rank_zero

    if not is_rank_zero():  # the other ranks are rank 0's own job
        return
    hold_run_dir(directory)  # held until the process ends; the run's own lock shares it
    check_fresh_start(directory, config.ckpt_path, config.start_over)


def check_device(config) -> None:
    """The device and attention backend the run asks for exist here (trainer=gpu without CUDA, flex
    training on CPU, varlen without CUDA bf16): refused before Lightning is imported or a directory made."""
    from pretrain.training.checks import attention_backend

    attention_backend(config.attn, config.trainer)


def note_new_outputs(argv: list[str]) -> None:
    """Runs go under ./outputs of the working directory: one line when that folder is new (a run
    started from another directory than the project's), so its runs are not looked for in vain."""
    from pathlib import Path

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


def check_run_dir(argv: list[str], multirun: bool = False):
    """The run directory (hydra.run.dir, a multirun's hydra.sweep.dir, else under ./outputs) must be
    creatable: refused in one line here rather than as Hydra's traceback when it makes the directory.
    Returns a single run's directory when it is known before Hydra resolves it (hydra.run.dir=DIR, a
    SLURM job's), else None (a new one, or a sweep's)."""
    import os
    from pathlib import Path

    from pretrain.errors import WriteError
    from pretrain.training.rundir import slurm_job_id

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


def _cannot_write_in(folder) -> OSError | None:
    """The error a file of Hydra's config's size meets in `folder` (None: it can be written): tried,
    then removed, so a full disk or a pseudo file system is one line here, not Hydra's traceback."""
    import os

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


def run() -> None:
    import hydra
    from omegaconf import DictConfig

    from pretrain.config import register_schema
    from pretrain.training.rundir import register_run_dir_resolver
    from pretrain.training.slurm_resources import register_slurm_resolvers

    register_schema()  # conf/train.yaml is typed by pretrain.config's schema
    register_run_dir_resolver()  # ${pretrain.run_dir:...}: SLURM job directories, unique ones elsewhere
    register_slurm_resolvers()  # ${pretrain.slurm_tasks:...}, ${pretrain.slurm_gpus:...}: launcher=slurm

    @hydra.main(config_path="conf", config_name="train", version_base="1.3")
    def main(cfg: DictConfig) -> None:
        from pretrain.errors import exit_on_user_error
        from pretrain.report.compare import plot_run
        from pretrain.training.run import train

        with exit_on_user_error():
            summary = train(cfg, plot_run=plot_run)
        if summary[
            "exit_code"
        ]:  # stopped by a signal: 128 + its number (143 SIGTERM, 138 SIGUSR1, 130 Ctrl-C)
            raise SystemExit(summary["exit_code"])

    check_overrides(sys.argv[1:])
    if any(arg in HELP_FLAGS for arg in sys.argv[1:]):
        show_help(main)
    main()


def show_help(main) -> None:
    """Hydra's --help without the `<policy>_schema` options it lists under `data:` (the schemas that
    type each policy's options are not choices)."""
    import contextlib
    import io

    from pretrain.errors import hide_schema_options

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        try:
            main()
        except SystemExit as exited:
            code = exited.code
        else:
            code = 0
    sys.stdout.write("\n".join(hide_schema_options(line) for line in text.getvalue().split("\n")))
    raise SystemExit(code)


if __name__ == "__main__":
    install_early()  # from here to the last line a signal ends the run as a preemption (preemption.py)
    try:
        run()
    except Interrupted as interrupted:  # before training started, or a second Ctrl-C
        sys.stderr.flush()
        raise SystemExit(interrupted.exit_code) from None
    exit_now(0)  # a run that returned: its files are written; skip the interpreter's teardown
