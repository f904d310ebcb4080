"""The arms' table rendered: the markdown of compare.md (the legend, each section's rows, the budget
and floors sections) and the rows of compare's W&B table (`WANDB_COLUMNS`)."""

from __future__ import annotations

import math

from . import floors as floor_models
from .arm_metrics import Metric
from .arm_table import EQUAL_WITHIN, ArmTable, contention_note
from .statistics import ALPHA, POWER, TOO_FEW, Comparison

MARKDOWN_COLUMNS = (
    "arm",
    "n",
    "mean",
    "std",
    "diff vs reference [95% CI]",
    "p",
    "Holm p",
    "MDE (80% power)",
    "test",
    "Holm p < 0.05",
)
WANDB_COLUMNS = (
    "metric",
    "at",
    "arm",
    "n",
    "mean",
    "std",
    "diff",
    "ci_low",
    "ci_high",
    "p",
    "p_holm",
    "mde",
    "test",
    "significant",
)
"""The W&B table (`compare/arms`): one row per metric and arm, numbers as numbers (None: n/a)."""


def _number(fmt: str, value: float) -> str:
    return fmt.format(value) if math.isfinite(value) else "n/a"


def p_text(p: float) -> str:
    """A p value as the table prints it: 3 decimals, `<0.001` below that, `n/a` without a test."""
    if not math.isfinite(p):
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _decision(comparison: Comparison) -> str:
    if comparison.test == TOO_FEW:
        return TOO_FEW
    if comparison.significant is None:
        return "n/a"
    return "yes" if comparison.significant else "no"


def _comparison_cells(metric: Metric, c: Comparison) -> list[str]:
    diff = _number(metric.diff_fmt, c.diff)
    if math.isfinite(c.low):
        diff += f" [{_number(metric.diff_fmt, c.low)}, {_number(metric.diff_fmt, c.high)}]"
    return [diff, p_text(c.p), p_text(c.holm), _number(metric.fmt, c.mde), c.test, _decision(c)]


def legend(table: ArmTable, arms: int) -> str:
    """What the table's comparison columns mean, for the markdown file."""
    ref = table.reference
    if ref is None:
        return "one arm: no reference to compare with; std: sample standard deviation over its seeds"
    family = arms - 1
    pairing = (
        "`paired t` where both arms ran the same seeds (the per-seed differences; n = pairs, df = n - 1; "
        "a seed gives both arms the same initial weights), `Welch t` otherwise (df Welch-Satterthwaite)"
        if table.paired
        else "`Welch t` for every arm (--unpaired: seeds not paired)"
    )
    return (
        f"reference: `{ref.label}`; diff = arm - reference with its {1 - ALPHA:.0%} confidence interval "
        f"from the t distribution; p: two-sided; Holm p: adjusted over the {family} arm(s) compared with "
        f"the reference in each section; MDE: the smallest true difference this design detects with "
        f"{POWER:.0%} power at the {ALPHA:.0%} level, for the spread observed (a difference that is not "
        f"significant says only that any effect is likely below it); test: {pairing}; `n<2`: an arm has "
        f"fewer than 2 seeds, no test. The last column says `yes` only where the Holm-adjusted p < "
        f"{ALPHA}; std: sample standard deviation over the arm's seeds"
    )


def budget_markdown(table: ArmTable) -> list[str]:
    """The budget section: each arm's updates and real tokens side by side, flagged where either
    differs from the reference's by more than EQUAL_WITHIN, and the compute each arm paid."""
    lines = [
        "",
        "### budget: what each arm was given (means over its seeds)",
        "",
        "| arm | n | updates | real tokens | computed tokens (real + padding) | training s | compared with "
        "the reference |",
        "|---|---|---|---|---|---|---|",
    ]
    flagged = []
    for budget in table.budgets:
        if table.reference is None or budget.arm is table.reference:
            verdict = "reference" if table.reference is not None else ""
        elif budget.unequal():
            verdict = "NOT equalised: " + ", ".join(budget.unequal())
            flagged.append(budget.arm.label)
        else:
            verdict = f"equal updates and real tokens (within {EQUAL_WITHIN:.0%})"
        cells = [budget.arm.label, str(budget.arm.n), _number("{:,.0f}", budget.updates)]
        cells += [_number("{:,.0f}", budget.real_tokens), _number("{:,.0f}", budget.computed_tokens)]
        cells += [_number("{:,.1f}", budget.seconds), verdict]
        lines.append("| " + " | ".join(cells) + " |")
    if table.contended:
        lines += ["", "training s: " + contention_note(table)]
    if flagged:
        lines += [
            "",
            f"{len(flagged)} arm(s) differ from the reference in updates or real tokens by more than "
            f"{EQUAL_WITHIN:.0%}: their loss differences mix the layout with the budget. At equal real "
            "tokens an arm with fewer real tokens per update (padding) has taken more updates; read the "
            "`optimizer step` section for equal updates, the `real tokens` one for equal tokens, and give "
            "the padded arm more rows per update (`train.batch_size`) to equalise both. Computed tokens "
            "beyond the real ones are cost, not part of the loss.",
        ]
    return lines


def floor_rows(table: ArmTable, metric: Metric) -> list[str]:
    """A val-loss section's floor rows, when every compared run scored the same validation pairs."""
    if not metric.floored:
        return []
    runs = [run for row in table.floors for run in row.arm.runs]
    rows = []
    for name in floor_models.FLOORS:
        value = floor_models.shared(runs, name)
        if math.isfinite(value):
            cells = [f"floor: {floor_models.DESCRIPTION[name]}", "", _number(metric.fmt, value)]
            rows.append("| " + " | ".join(cells + [""] * (len(MARKDOWN_COLUMNS) - 3)) + " |")
    return rows


def floors_markdown(table: ArmTable) -> list[str]:
    """The floors section: each arm's floors and whether its seeds ended below the lower bigram floor."""
    if not any(math.isfinite(row.bigram) for row in table.floors):
        return [
            "",
            "### floors",
            "",
            "no run has floors in its run.json (runs from before floors were computed): whether the arms "
            "learned any context cannot be told from this table",
        ]
    lines = [
        "",
        "### floors: final val loss against context-free models counted on the train split "
        "(the same validation pairs; nats per pair)",
        "",
        "| arm | n | final val loss | unigram floor | bigram floor (JM) | bigram floor (KN) "
        "| below the lower bigram floor | real tokens to reach it (extrapolated) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    stuck = []
    for row in table.floors:
        if row.judged == 0:
            verdict = "n/a"
        elif row.below_bigram == row.judged:
            verdict = f"yes ({row.below_bigram}/{row.judged} seeds)"
        else:
            verdict = f"no ({row.below_bigram}/{row.judged} seeds)"
            stuck.append(row.arm.label)
        cells = [row.arm.label, str(row.arm.n), _number("{:.4f}", row.val_loss)]
        cells += [_number("{:.4f}", v) for v in (row.unigram, row.bigram, row.bigram_kn)]
        cells.append(verdict)
        cells.append("" if row.below_bigram == row.judged else _number("{:,.0f}", row.tokens_to_bigram))
        lines.append("| " + " | ".join(cells) + " |")
    if stuck:
        lines += [
            "",
            f"{len(stuck)} arm(s) did not end below the lower bigram floor in every seed: a model there "
            "predicts little better than from the previous token alone, and masking, truncation and "
            "fragmentation act through longer context, so their effect cannot show in these arms at any "
            "number of seeds; train longer (more tokens, a decaying learning rate) before reading a layout "
            "effect. The last column extrapolates each such arm's validations (the second half of them, "
            "linear in log tokens; the median over seeds) to that floor: an estimate of the budget needed, "
            "n/a where its curve has fewer than 3 validations or is not falling.",
        ]
    return lines


def markdown(table: ArmTable) -> str:
    """The budget, one section per metric (its heading says at which x; val losses with the floors),
    the runs each left out, then the floors per arm."""
    ref = table.reference
    arms = len(table.sections[0].rows) if table.sections else 0
    lines = ["## arms (runs that differ only in seed; n = seeds)", "", legend(table, arms)]
    lines += budget_markdown(table)
    for section in table.sections:
        metric = section.metric
        lines += ["", f"### {metric.name}", ""]
        if metric.timed and table.contended:
            lines += [contention_note(table), ""]
        lines += ["| " + " | ".join(MARKDOWN_COLUMNS) + " |", "|---" * len(MARKDOWN_COLUMNS) + "|"]
        for row in section.rows:
            summary, comparison = row.summary, row.comparison
            if comparison is None:
                diff_cells = ["reference" if row.arm is ref else ""] + [""] * (len(MARKDOWN_COLUMNS) - 5)
            else:
                diff_cells = _comparison_cells(metric, comparison)
            cells = [row.arm.label, str(summary.n), _number(metric.fmt, summary.mean)]
            cells += [_number(metric.fmt, summary.std), *diff_cells]
            lines.append("| " + " | ".join(cells) + " |")
        lines += floor_rows(table, metric)
        if section.left_out:
            names = ", ".join(str(run.path) for run in section.left_out)
            lines += ["", f"left out ({metric.missing}): {names}"]
    lines += floors_markdown(table)
    return "\n".join(lines) + "\n"


def _cell(value: float) -> float | None:
    return value if math.isfinite(value) else None


def wandb_rows(table: ArmTable) -> list[list]:
    """The markdown table's content in WANDB_COLUMNS order, one row per metric and arm."""
    rows = []
    for section in table.sections:
        metric = section.metric
        for row in section.rows:
            c = row.comparison
            numbers = (
                [None] * 6 if c is None else [_cell(v) for v in (c.diff, c.low, c.high, c.p, c.holm, c.mde)]
            )
            rows.append(
                [
                    metric.name,
                    None if metric.at is None else _cell(metric.at),
                    row.arm.label,
                    row.summary.n,
                    _cell(row.summary.mean),
                    _cell(row.summary.std),
                    *numbers,
                    None if c is None else c.test,
                    None if c is None else c.significant,
                ]
            )
    return rows
