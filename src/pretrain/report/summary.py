"""What `pretrain compare` prints: one screen (at most ~25 lines) with the headline per cell, the
pooled lines, which runs were left out and how to fix it, and the files written; the rest is in
compare.md and compare.json."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from ..training.run_record import Run
from .arm_render import p_text
from .arm_table import CONTENDED, ArmTable
from .arms import Arm
from .contrast_render import interval_text
from .contrasts import Contrast, ContrastTable, describe
from .statistics import TOO_FEW

HEADLINE = "val_loss"
"""The metric of the per-cell lines: final val loss, at matched settings an equal-compute comparison."""
ALSO = ("val_loss_at_tokens", "padding_waste")
"""Metrics summarized by their pooled line (or the one cell's) under the headline."""
MAX_ROWS = 12
"""Cells (or arms) listed; the rest are counted and left to compare.md."""
SEEDS_HINT = "seed=0,1,2"


SHORT_NAMES = {"val_loss_at_tokens": "val loss at equal real tokens", "padding_waste": "padding waste"}
LABEL_WIDTH = 38


def _row(label: str, c: Contrast, fmt: str = "{:+.4f}") -> str:
    if c.test == TOO_FEW:
        test = f"n={c.n} vs {c.n_reference}: no interval"
    else:
        test = f"Holm p {p_text(c.p_holm)}, {c.test}, n={c.n}"
    return f"  {label:<{LABEL_WIDTH}} {interval_text(c, fmt)}  ({test})"


def _contrast_lines(contrasts: ContrastTable) -> list[str]:
    lines: list[str] = []
    cells = " x ".join(key.split(".")[-1] for key in contrasts.keys)
    shown = 0
    for level in contrasts.levels[1:]:
        rows = [c for c in contrasts.rows(HEADLINE, pooled=False) if c.level == level]
        if not rows:
            continue
        where = f" per cell of {cells}" if contrasts.keys else ""
        lines.append(f"{level} - {contrasts.reference}, final val loss{where} (diff [95% CI]):")
        for c in rows:
            if shown == MAX_ROWS:
                break
            lines.append(_row(describe(c.setting), c))
            shown += 1
        lines += [
            _row(f"pooled over {c.n} cells", c)
            for c in contrasts.rows(HEADLINE, pooled=True)
            if c.level == level
        ]
        for key in ALSO:
            pooled = [c for c in contrasts.rows(key, pooled=True) if c.level == level]
            one = [c for c in contrasts.rows(key, pooled=False) if c.level == level]
            chosen = pooled or (one if len(one) == 1 else [])
            for c in chosen:
                fmt = "{:+.2%}" if key == "padding_waste" else "{:+.4f}"
                lines.append(_row(f"{SHORT_NAMES[key]}{' (pooled)' if c.pooled else ''}", c, fmt))
    hidden = len(contrasts.rows(HEADLINE, pooled=False)) - shown
    if hidden > 0:
        lines.append(f"  ... {hidden} more cell(s) in compare.md")
    for setting, levels in contrasts.missing[:3]:
        lines.append(f"missing cell: {describe(setting)} has no {', '.join(levels)} run: no contrast there")
    if len(contrasts.missing) > 3:
        lines.append(f"... {len(contrasts.missing) - 3} more missing cell(s) in compare.md")
    return lines


def _reference_lines(table: ArmTable) -> list[str]:
    """Without a contrast: each arm's final val loss against the reference arm."""
    sections = [s for s in table.sections if s.metric.key == HEADLINE]
    if table.reference is None or not sections:
        return []
    lines = [f"final val loss against {table.reference.label} (nats; diff [95% CI]; Holm over the arms):"]
    rows = [row for row in sections[0].rows if row.comparison is not None]
    for row in rows[:MAX_ROWS]:
        c = row.comparison
        assert c is not None
        contrast = Contrast(
            "",
            "",
            "",
            {},
            HEADLINE,
            "",
            None,
            c.n,
            c.n_reference,
            math.nan,
            math.nan,
            c.diff,
            c.low,
            c.high,
            c.p,
            c.holm,
            c.mde,
            c.test,
        )
        lines.append(_row(row.arm.label, contrast))
    if len(rows) > MAX_ROWS:
        lines.append(f"  ... {len(rows) - MAX_ROWS} more arm(s) in compare.md")
    return lines


VALIDATION_FIX = "train.val_every_n_steps=auto (validates ~5 times a run)"


def _left_out_lines(table: ArmTable) -> list[str]:
    """One line per reason a run lacks a value, the fix where there is one."""
    reasons: dict[str, set[Path]] = defaultdict(set)
    for section in table.sections:
        # The final val losses (interpolated rows are read at each cell's own reach in the contrasts).
        if section.metric.floored and section.metric.at is None:
            for run in section.left_out:
                reasons[section.metric.missing].add(run.path)
    lines = []
    for why, paths in reasons.items():
        fix = ""
        if "validat" in why:
            fix = f"; rerun with {VALIDATION_FIX}"
        if "span" in why:
            fix = "; rerun them with the others' train.max_steps, or pass --at-tokens / --at-step"
        lines.append(f"left out of a val-loss row: {len(paths)} run(s) ({why}){fix}")
    return lines[:3]


def _context_lines(table: ArmTable, shown: int = 4) -> list[str]:
    """The arms' context gain (training/context_use.py), when the runs scored it: a model that gains
    nothing from its context gives composition nothing to act on."""
    sections = [s for s in table.sections if s.metric.key == "context_gain"]
    if not sections or not sections[0].rows:
        return []
    rows = sections[0].rows
    gains = ", ".join(f"{row.arm.label} {row.summary.mean:+.3f}" for row in rows[:shown])
    more = f", {len(rows) - shown} more in compare.md" if len(rows) > shown else ""
    flat = [row for row in rows if not row.summary.mean > 0]
    verdict = f"; {len(flat)} arm(s) gain nothing from context: composition cannot act there" if flat else ""
    return [f"context gain (previous token alone - val loss, nats): {gains}{more}{verdict}"]


DOWNSTREAM_SHOWN = {
    "downstream.pretrain_cloze.acc": ("cloze accuracy", "{:.4f}"),
    "downstream.pretrain_recall.loglikelihood_difference": (
        "recall, distractor - plain (log-lik.)",
        "{:+.4f}",
    ),
}
"""The downstream scores named on screen (per arm); every one is a section of compare.md."""


def _downstream_lines(table: ArmTable, shown: int = 4) -> list[str]:
    """`pretrain lm-eval`'s scores, when the runs' run.json have them: how many sections, and the
    arms' means of the two that speak to composition."""
    sections = [s for s in table.sections if s.metric.key.startswith("downstream.")]
    if not sections:
        return []
    lines = [
        f"downstream (pretrain lm-eval): {len(sections)} score(s) per arm in compare.md, paired as val loss"
    ]
    for section in sections:
        if section.metric.key not in DOWNSTREAM_SHOWN or not section.rows:
            continue
        name, fmt = DOWNSTREAM_SHOWN[section.metric.key]
        means = ", ".join(f"{row.arm.label} {fmt.format(row.summary.mean)}" for row in section.rows[:shown])
        more = f", {len(section.rows) - shown} more" if len(section.rows) > shown else ""
        lines.append(f"  {name}: {means}{more}")
    return lines


def summary_lines(
    runs: list[Run], arms: list[Arm], table: ArmTable, contrasts: ContrastTable | None, files: list[Path]
) -> list[str]:
    seeds = sorted({arm.n for arm in arms})
    seeded = "1 seed each" if seeds == [1] else f"{'-'.join(map(str, (seeds[0], seeds[-1])))} seeds per arm"
    if len(seeds) == 1 and seeds[0] > 1:
        seeded = f"{seeds[0]} seeds each"
    lines = [f"compared {len(runs)} run(s) in {len(arms)} arm(s), {seeded}"]
    lines += _contrast_lines(contrasts) if contrasts and contrasts.contrasts else _reference_lines(table)
    if len(arms) > 1 and max(seeds) < 2:
        lines.append(
            f"no arm has 2 seeds, so no difference has an interval: add {SEEDS_HINT} to the same sweep "
            "command (pooled lines need >= 3 cells instead)"
        )
    lines += _left_out_lines(table)
    stuck = [row for row in table.floors if row.judged and row.below_bigram < row.judged]
    if stuck:
        lines.append(
            f"{len(stuck)} arm(s) ended above the bigram floor in some seed: layout effects cannot show "
            "there; train longer (compare.md, floors)"
        )
    lines += _context_lines(table)
    lines += _downstream_lines(table)
    if table.contended:
        lines.append(
            f"UNRELIABLE times: {len(table.contended)} run(s) shared the machine with other work "
            f"(load per CPU above {CONTENDED}); the loss rows stand (compare.md)"
        )
    folder = files[0].parent if files else Path(".")
    lines.append(f"wrote in {folder}: {' '.join(path.name for path in files)}")
    return lines
