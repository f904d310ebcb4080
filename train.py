"""Train a GPT on the token cache: python train.py [Hydra overrides], e.g. data=padded attn=sdpa."""

import sys

from pretrain.training.preemption import Interrupted, install_early


def check_overrides(argv: list[str]) -> None:
    """Compose and type-check the overrides before Hydra starts: a bad override, an unknown key or
    option, a value out of range, or a device or attention backend this machine lacks is one `error:`
    line with exit 2, and no run directory is made.
    (Hydra's own flags and sweeps, `-m a=1,2`, are left to Hydra.)"""
    if any(arg.startswith("-") for arg in argv):
        return
    from pretrain.config import load_config, to_config
    from pretrain.data.mixture import check_sources
    from pretrain.errors import exit_on_user_error

    with exit_on_user_error():
        config = to_config(load_config(argv))
        directory = check_run_dir(argv)
        check_device(config)
        check_sources(config)  # a mixture's policy and every source's keys (nothing hashed)
        if directory is not None:
            lock_run_dir(directory, config)


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


def _override_value(override: str) -> str:
    """The value of `key=value` as Hydra reads it (quotes and escapes as its grammar has them)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        (parsed,) = OverridesParser.create().parse_overrides([override])
        return str(parsed.value())
    except Exception:  # Hydra itself reports a malformed override, in one line
        return override.split("=", 1)[1].strip("'\"")


def check_run_dir(argv: list[str]):
    """The run directory (hydra.run.dir, else under ./outputs) must be creatable: refused in one line
    here rather than as Hydra's traceback when it makes the directory. Returns the directory when it
    is known before Hydra resolves it (hydra.run.dir=DIR, a SLURM job's), else None (a new one)."""
    import os
    from pathlib import Path

    from pretrain.errors import WriteError
    from pretrain.training.rundir import slurm_job_id

    given = [_override_value(arg) for arg in argv if arg.startswith("hydra.run.dir=")]
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
            "run elsewhere with hydra.run.dir=DIR"
        )
    failed = _cannot_write_in(existing)  # root passes os.access on /sys; a full disk passes it too
    if failed is not None:
        import errno

        free = "free disk space or " if failed.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        raise WriteError(
            f"cannot create the run directory {target}: cannot write in {existing} "
            f"({failed.strerror or failed}); {free}run elsewhere with hydra.run.dir=DIR"
        )
    return known


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

    register_schema()  # conf/train.yaml is typed by pretrain.config's schema
    register_run_dir_resolver()  # ${pretrain.run_dir:...}: SLURM job directories, unique ones elsewhere

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
    main()


if __name__ == "__main__":
    install_early()  # from here to the last line a signal ends the run as a preemption (preemption.py)
    try:
        run()
    except Interrupted as interrupted:  # before training started, or a second Ctrl-C
        sys.stderr.flush()
        raise SystemExit(interrupted.exit_code) from None
