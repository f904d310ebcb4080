"""The `pretrain` command: prepare, verify, inspect-data, compare, eval, export, lm-eval.

One convention for outputs: every subcommand that writes a file takes `--output PATH` and `output=PATH`
alike (the Hydra-style spelling sits naturally among overrides). A usage error shows the usage of the
subcommand it concerns.

Errors a user can fix (`pretrain.errors.PretrainError` and Hydra's config errors) are printed in one
line with exit status 2; anything else keeps its traceback. Ctrl-C (exit 130) and SIGTERM (exit 143,
stop_signals.py) unwind through every cleanup: nothing half-written stays.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .errors import ConfigError, exit_on_user_error
from .report.compare_options import add_compare_parser
from .stop_signals import Terminated, sigterm_unwinds

OUTPUT_SPELLING = "output="
"""`output=PATH` among the arguments means `--output PATH` (not a config key: no schema has `output`)."""


VALUE_OPTIONS = (
    *("--output", "--reference", "--contrast", "--at-tokens", "--at-seconds", "--at-step"),
    *("--tasks", "--limit", "--seed", "--tasks-dir", "--batch-size", "--examples"),
)
"""Options followed by their value: `_options_last` moves the pair together."""


def counts_table(cache) -> Table:
    table = Table(title=f"cache {cache.directory.name}")
    for column in ("split", "documents", "raw tokens (EOS incl.)", "prediction pairs"):
        table.add_column(column, justify="right" if column != "split" else "left")
    for split, counts in cache.counts().items():
        table.add_row(
            split, f"{counts['documents']:,}", f"{counts['tokens']:,}", f"{counts['prediction_pairs']:,}"
        )
    build = cache.manifest.get("build", {})
    read = build.get("documents_read", "?")
    skipped = [build.get(f"{kind}_skipped", 0) for kind in ("duplicates", "empty", "over_budget")]
    table.caption = (
        f"read {read:,} documents: skipped {skipped[0]:,} duplicates, {skipped[1]:,} empty, "
        f"{skipped[2]:,} over budget"
    )
    return table


def _cache_spec(overrides: list[str]):
    from .config import load_config, to_config

    config = to_config(load_config(overrides))  # a bad override fails before the heavy imports below
    from .data.ingest.cache import CacheSpec

    return config, CacheSpec.from_config(config)


def cmd_prepare(overrides: list[str]) -> int:
    from .config import load_config, to_config
    from .prepare_tasks import run_prepare

    config = to_config(load_config(overrides))
    # A mixture: each component's cache in turn (its own source and budget), one directory per line.
    for one in component_configs(config) if config.mixture is not None else [config]:
        path, cache = run_prepare(one)  # a task (prepare.task=i) prints its part file instead
        if cache is not None:
            Console().print(counts_table(cache))
        print(path)
    return 0


def component_configs(config):
    """A mixture's components as single-source configs (`source` and `budget` theirs, no mixture)."""
    from dataclasses import replace

    assert config.mixture is not None
    return [
        replace(config, source=c.source, budget=c.budget or config.budget, mixture=None)
        for c in config.mixture.components.values()
    ]


def cmd_verify(overrides: list[str]) -> int:
    """Full sha256 verification of the config's cache (a mixture: each component's), in place (it may
    be read-only)."""
    from .data.ingest.prepare import verify_existing
    from .data.mixture import MixtureSpec

    config, spec = _cache_spec(overrides)
    mixture = MixtureSpec.from_config(config)
    for one in [spec] if mixture is None else [c.cache for c in mixture.components]:
        result = verify_existing(one, "full")
        Console().print(verification_table(result))
        print(result.directory)
    return 0


def verification_table(result) -> Table:
    table = Table(title=f"verify {result.directory.name} (full)")
    for column in ("file", "bytes", "sha256", "check"):
        table.add_column(column, justify="right" if column == "bytes" else "left")
    files = result.manifest["splits"]
    for split in files:
        for entry in files[split]["files"].values():
            check = "sha256 matches" if entry["name"] in result.hashed else "stat unchanged since verified"
            table.add_row(entry["name"], f"{entry['bytes']:,}", entry["sha256"][:16], check)
    index = "JSONL and .index.npy indexes agree, tile the tokens, EOS closes every document; "
    table.caption = (
        f"manifest checksum and identity ok; token_dtype {result.manifest['token_dtype']}; "
        + (index if result.index_checked else "")
        + f"{result.seconds:.1f} s; verified record: {result.record or 'none (nowhere writable)'}"
    )
    return table


def cmd_inspect(overrides: list[str], output: str | None) -> int:
    config, spec = _cache_spec(overrides)
    path = _check_output_file(output, example="stats.json") if output else None  # before the work
    from .data.floors import combined_floors, spec_floors
    from .data.ingest.prepare import prepare_cache
    from .data.mixture import MixtureSpec
    from .data.policies import PolicySettings
    from .data.sources.summary import source_summary
    from .data.stats import inspect_split
    from .report.inspect_table import render_table

    settings = PolicySettings.from_config(config.data, config.train, config.seed)
    mixture = MixtureSpec.from_config(config)
    if mixture is None:
        cache = prepare_cache(spec)
        stats = inspect_split(
            settings, cache.split("train"), cache.split("validation"), packs_dir=cache.packs_dir
        )
        # task=sft: val/loss counts the trained targets only, which the floors do not single out
        stats["floors"] = None if cache.masked else spec_floors(spec, cache)
        stats["source"] = source_summary(spec.source, cache)  # its size and where its text came from
    else:  # the mixed epoch, and each component's statistics under mixture.<name>
        mixture.check_policy(settings.policy)
        caches = [prepare_cache(component.cache) for component in mixture.components]
        train, mixed = mixture.mix([cache.split("train") for cache in caches])
        parts = [cache.split("validation") for cache in caches]
        validation, _ = mixture.mix(parts)
        stats = inspect_split(settings, train, validation, mixture=mixed, validation_parts=parts)
        floors = {
            c.name: spec_floors(c.cache, cache) for c, cache in zip(mixture.components, caches, strict=True)
        }
        for name, floor in floors.items():
            stats["mixture"][name]["floors"] = floor
        for component, cache in zip(mixture.components, caches, strict=True):
            stats["mixture"][component.name]["source"] = source_summary(component.cache.source, cache)
        stats["floors"] = {k: v for k, v in combined_floors(floors).items() if k != "components"}
    Console().print(render_table(stats))
    if path is not None:  # without one the table is the answer
        _write_output(path, json.dumps(stats, indent=2, default=float) + "\n")
        print(path)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from .errors import WriteError
    from .report.compare import compare
    from .report.figure import check_output

    # The plot's path (default: compare.png in the first directory) is checked before the work.
    output = Path(args.output) if args.output else Path(args.dirs[0]) / "compare.png"
    check_output(output)
    if args.output or output.parent.is_dir():  # a missing run directory is compare's to name
        shown = str(output) if args.output else f"{output} (the default)"
        _check_output_file(str(output), spelling=f"--output {shown}", example="compare.png")
    try:
        compare(
            [Path(d) for d in args.dirs],
            output=output,
            wandb=args.wandb,
            reference=args.reference,
            at_tokens=args.at_tokens,
            at_seconds=args.at_seconds,
            at_step=args.at_step,
            paired=not args.unpaired,
            timing=not args.no_timing,
            contrast=args.contrast,
        )
    except WriteError:
        raise
    except OSError as error:  # the plot and its .md table are written atomically: nothing half-written
        raise WriteError(
            f"compare: {error.filename or output}: {error.strerror or error}; free disk space or pick "
            "another --output FILE.png"
        ) from None
    return 0


def _check_output_file(output: str, spelling: str | None = None, example: str = "eval.json") -> Path:
    """An `output=FILE` checked before the work that fills it: its folder exists (or can be made) and
    is writable, and it is not a directory. `spelling` names it in messages (default `output=FILE`;
    compare: `--output FILE`)."""
    name = spelling or f"output={output}"
    flag = name.startswith("--output")
    other = "--output FILE.png" if flag else "output=FILE"
    path = Path(output).resolve()
    if path.is_dir():
        given = f"--output {Path(output) / example}" if flag else f"output={output}/{example}"
        raise ConfigError(f"{name} is a directory: give a file name, e.g. {given}")
    folder = path.parent
    blocker = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise ConfigError(f"{name}: {blocker} is a file, not a folder; pick another {other}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"{name}: cannot create {folder} ({error.strerror or error})") from None
    if not os.access(folder, os.W_OK | os.X_OK) or not _can_create_in(folder):
        raise ConfigError(f"{name}: {folder} is not writable; pick another {other}")
    return path


def _can_create_in(folder: Path) -> bool:
    """A file can be made in `folder` (root passes os.access on a read-only mount: try it)."""
    from .fileio import temporary_path

    probe = temporary_path(folder / "write-test")
    try:
        probe.touch(exist_ok=False)
    except OSError:
        return False
    probe.unlink(missing_ok=True)
    return True


def _write_output(path: Path, text: str) -> None:
    from .errors import WriteError
    from .fileio import remove_stale_temporaries, write_text_atomic

    remove_stale_temporaries(path.parent)  # of an earlier eval killed while writing
    try:
        write_text_atomic(path, text)
    except OSError as error:
        raise WriteError(
            f"could not write {path}: {error.strerror or error}; free disk space or pick another output=FILE"
        ) from None


def cmd_eval(checkpoint: str, overrides: list[str], output: str | None) -> int:
    from .evaluate import evaluate_checkpoint

    path = _check_output_file(output) if output else None  # before minutes of evaluation
    result = evaluate_checkpoint(checkpoint, overrides)
    table = Table(
        title=f"eval: {checkpoint} (step {result['step']}, policy {result['policy']}, positions "
        f"{result['positions']}: each validation chunk from 0; trained with {result['trained_positions']})"
    )
    table.add_column("statistic")
    table.add_column("value", justify="right")
    rows = [("", result), *((f"{name}.", part) for name, part in result.get("components", {}).items())]
    for prefix, values in rows:  # a mixture: each component's rows after the overall ones
        for key in ("loss", "perplexity", "bits_per_byte", "targets", "documents", "bytes"):
            value = values[key]
            table.add_row(prefix + key, f"{value:,.4f}" if isinstance(value, float) else f"{value:,}")
    Console().print(table)
    if path is not None:
        _write_output(path, json.dumps(result, indent=2) + "\n")
        print(path)
    return 0


def cmd_export(checkpoint: str, output: str) -> int:
    from .hf import export

    directory = export(checkpoint, output)
    print(directory)
    return 0


def cmd_lm_eval(args: argparse.Namespace) -> int:
    from .downstream.command import LmEvalRequest, parse_tasks, run_lm_eval, summary_rows

    path = _check_output_file(args.output, "--output FILE", "lm-eval.json") if args.output else None
    request = LmEvalRequest(
        checkpoint=args.checkpoint,
        tasks=parse_tasks(args.tasks),
        limit=args.limit,
        seed=args.seed,
        batch_size=args.batch_size,
        tasks_dir=Path(args.tasks_dir) if args.tasks_dir else None,
        examples=args.examples,
    )
    result = run_lm_eval(request)
    identity = result["checkpoint"]
    where = f"step {identity['step']}, policy {identity['policy']}" if "step" in identity else "export"
    table = Table(title=f"lm-eval {result['lm_eval_version']}: {args.checkpoint} ({where})")
    table.add_column("task.metric")
    table.add_column("value", justify="right")
    for name, value in summary_rows(result):
        table.add_row(name, value)
    Console().print(table)
    if result.get("run_json"):
        print(f"recorded in {result['run_json']} (downstream)")
    if result.get("wandb"):
        print(f"and in the run's W&B summary (downstream/...): {result['wandb']}")
    if path is not None:
        _write_output(path, json.dumps(result, indent=2, default=str) + "\n")
        print(path)
    return 0


def _add_lm_eval(sub) -> None:
    """`pretrain lm-eval CKPT --tasks NAMES` and its options (docs/evaluation.md)."""
    lm_eval = sub.add_parser(
        "lm-eval", help="lm-evaluation-harness on a checkpoint: the project's offline tasks or the harness's"
    )
    lm_eval.add_argument("checkpoint", help="a .ckpt written by python train.py, or an exported directory")
    lm_eval.add_argument(
        "--tasks",
        required=True,
        help="comma-separated: pretrain_cloze, pretrain_recall, pretrain_bpb, or lm-eval tasks (hub data)",
    )
    lm_eval.add_argument("--limit", type=int, metavar="N", help="at most N examples per task")
    lm_eval.add_argument("--seed", type=int, default=0, help="the seed the project's tasks are drawn with")
    lm_eval.add_argument("--batch-size", type=int, default=16, metavar="N", help="requests per forward")
    lm_eval.add_argument(
        "--examples", type=int, default=1000, metavar="N", help="examples written per project task"
    )
    lm_eval.add_argument(
        "--tasks-dir", metavar="DIR", help="keep the generated task files here (lm_eval --include_path DIR)"
    )
    _add_output(lm_eval, "also write the result as JSON to this file")


def _add_output(parser: argparse.ArgumentParser, help: str, required: bool = False) -> None:
    parser.add_argument("--output", metavar="PATH", required=required, help=f"{help} (or output=PATH)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pretrain", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    prepare = sub.add_parser("prepare", help="build or verify the token cache; prints its directory last")
    prepare.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. source=local source.files='[a.parquet]'"
    )
    verify = sub.add_parser("verify", help="full sha256 verification of the cache; prints its directory last")
    verify.add_argument("overrides", nargs="*", help="Hydra overrides naming the cache, as for prepare")
    inspect = sub.add_parser("inspect-data", help="statistics of the cache under the chosen policy")
    inspect.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. data=padded data.max_seq_len=1024"
    )
    _add_output(inspect, "also write the statistics as JSON to this file (the table is always printed)")
    add_compare_parser(sub)
    evaluate = sub.add_parser("eval", help="validation loss, perplexity and bits per byte of a checkpoint")
    evaluate.add_argument("checkpoint", help="a .ckpt written by python train.py")
    evaluate.add_argument(
        "overrides", nargs="*", help="overrides on the checkpoint's config, e.g. data=padded"
    )
    _add_output(evaluate, "also write the result as JSON to this file")
    export = sub.add_parser("export", help="a Hugging Face GPT2LMHeadModel directory from a checkpoint")
    export.add_argument("checkpoint", help="a .ckpt written by python train.py")
    _add_output(export, "the new model directory", required=True)
    _add_lm_eval(sub)
    return parser


def _options_last(argv: list[str]) -> list[str]:
    """After the subcommand: `output=PATH` becomes `--output=PATH` (both spellings mean the same) and
    the options move behind the positionals, so `eval CKPT data=padded --output e.json attn=sdpa`
    keeps every override (argparse stops filling `overrides` at the first option)."""
    if not argv or argv[0].startswith("-"):
        return argv
    positionals, options = [], []
    items = iter(argv[1:])
    for item in items:
        if item in VALUE_OPTIONS:  # its value moves with it (an arm's label may hold `=` and spaces)
            value = next(items, None)  # none: argparse says "expected one argument"
            options.append(item if value is None else f"{item}={value}")
        elif item.startswith(OUTPUT_SPELLING):
            options.append(f"--{item}")
        elif item.startswith("-"):
            options.append(item)
        else:
            positionals.append(item)
    return [argv[0], *positionals, *options]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The parsed command line; a usage error names the subcommand's usage, not the top level's."""
    argv = _options_last(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse would report these with the top-level usage
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        subparsers.choices[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with exit_on_user_error(), sigterm_unwinds():  # SIGTERM, as Ctrl-C, leaves nothing half-written
            if args.command == "prepare":
                return cmd_prepare(args.overrides)
            if args.command == "inspect-data":
                return cmd_inspect(args.overrides, args.output)
            if args.command == "verify":
                return cmd_verify(args.overrides)
            if args.command == "eval":
                return cmd_eval(args.checkpoint, args.overrides, args.output)
            if args.command == "export":
                return cmd_export(args.checkpoint, args.output)
            if args.command == "lm-eval":
                return cmd_lm_eval(args)
            return cmd_compare(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated as stopped:
        print("terminated", file=sys.stderr)
        return stopped.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
