"""Train a GPT on the token cache: python train.py [Hydra overrides], e.g. data=padded attn=sdpa."""

import sys

try:
    from pretrain.training import startup_collector

    startup_collector.pause()  # until the run's settings are known (startup_collector.py)
    from pretrain.cli.fast_exit import run_and_exit
    from pretrain.training.preemption import Interrupted, install_early
except ModuleNotFoundError as missing:  # run outside the project's environment: say how to enter it
    print(
        f"error: cannot import {missing.name!r} ({missing}): run inside the project's environment, "
        "`source .venv/bin/activate` (after `make install`), or `make train`",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

HELP_FLAGS = ("-h", "--help")


def check_overrides(argv: list[str]) -> None:
    """Compose and check `argv` before Hydra starts (launch_checks.py): a multirun's every job; a
    single run is checked on Hydra's own composition instead (launch_checks.CheckBeforeRun)."""
    from pretrain.cli.launch_checks import check_overrides as check

    check(argv)


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
        from pretrain.cli.launch_checks import checked_config
        from pretrain.errors import exit_on_user_error
        from pretrain.training.run import train

        with exit_on_user_error():
            checked = checked_config(cfg)
            summary = train(checked, plot_run=plot_run)
            if not summary["exit_code"]:  # eval.downstream: pretrain lm-eval on last.ckpt (rank 0)
                from pretrain.downstream.after_training import evaluate_after_training

                evaluate_after_training(checked, summary)
        if summary[
            "exit_code"
        ]:  # stopped by a signal: 128 + its number (143 SIGTERM, 138 SIGUSR1, 130 Ctrl-C)
            raise SystemExit(summary["exit_code"])

    from pretrain.cli.launch_checks import MULTIRUN_FLAGS

    argv = sys.argv[1:]
    if any(arg in HELP_FLAGS for arg in argv):
        show_help(main)
    if any(arg in MULTIRUN_FLAGS for arg in argv):
        # A sweep composes every job's config here: each leaves garbage cycles (OmegaConf's parent
        # links) that a paused collector would keep for the whole sweep.
        startup_collector.resume()
        check_overrides(argv)  # every job's config, before Hydra makes the sweep directory
        main()
        return
    run_single(main, argv)


def plot_run(*args, **kwargs):
    """The run's comparison plot (report/compare.py), imported when the run has finished."""
    from pretrain.report.compare import plot_run as plot

    return plot(*args, **kwargs)


def run_single(main, argv: list[str]) -> None:
    """One run, checked on Hydra's composition (launch_checks.CheckBeforeRun, in conf/train.yaml's
    hydra.callbacks). Hydra raises rather than prints its own errors here (HYDRA_FULL_ERROR), so a
    composition error is reported as every config error is: `check_overrides` composes the command
    line again and refuses it in one line, exit 2; so is Hydra's failure to write the run directory (a
    full disk). Anything else keeps its traceback."""
    import os

    from pretrain.cli.launch_checks import report_run_dir_write
    from pretrain.errors import exit_on_user_error, one_line_errors

    before = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except one_line_errors() as error:
        check_overrides(argv)  # exits 2 with the composition error in one line
        with exit_on_user_error():
            raise error
    except OSError as error:
        report_run_dir_write(error)  # exits 2 when Hydra could not write the run directory
        raise
    finally:
        if before is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = before


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


def run_interruptible() -> None:
    """`run`, where a signal before training (or a second Ctrl-C) exits 128 + its number."""
    try:
        run()
    except Interrupted as interrupted:
        raise SystemExit(interrupted.exit_code) from None


if __name__ == "__main__":
    install_early()  # from here to the last line a signal ends the run as a preemption (preemption.py)
    # The run's files are written when it returns or exits with a code: skip the interpreter's teardown,
    # which on a DDP rank stopped by SIGTERM could abort in gloo's threads (fast_exit.py).
    run_and_exit(run_interruptible)
