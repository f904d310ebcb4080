"""`pretrain inspect-data`'s table: the statistics of measures/stats.py as two rich columns, with the loud
problems (validation documents seen in training) in red."""

from __future__ import annotations

import math

from rich.table import Table

from ..data.leaks import LEAK_WINDOW

# Fractions the table shows in percent.
PERCENT_KEYS = frozenset(
    {
        "pack_utilization",
        "padding_waste",
        "cross_document_visible_fraction",
        "truncated_documents",
        "dropped_pairs",
        "fragmented_documents",
        "trained_fraction",  # task=sft's loss-mask audit
        "padding_waste_trained",
        # a mixture component's (mixture.<name>.*)
        "weight",
        "share",
        "documents_used_per_epoch",
        "update_share_deviation_max",
        "update_share_deviation_mean",
    }
)


FLOOR_KEYS = frozenset({"nats", "bits_per_byte", "lambda"})
"""The floors' numbers (data/measures/floors.py): shown to four decimals."""


LEAK_IDS_NAMED = 3
"""The leak warning names this many documents (id prefixes); the JSON lists every one."""


def stats_warnings(stats: dict) -> list[str]:
    """Loud problems: validation documents seen in training."""
    lines = []
    if stats.get("train_validation_overlap", 0) > 0:
        lines.append(
            f"WARNING: {stats['train_validation_overlap']} document ids are in both train and validation"
        )
    if stats.get("verbatim_leaks", 0) > 0:
        ids = stats.get("verbatim_leak_ids", [])
        named = ", ".join(i[:12] for i in ids[:LEAK_IDS_NAMED]) + (
            ", ..." if len(ids) > LEAK_IDS_NAMED else ""
        )
        count = stats["verbatim_leaks"]
        documents = "1 validation document shares" if count == 1 else f"{count} validation documents share"
        lines.append(
            f"WARNING: {documents} a {LEAK_WINDOW}-token passage with a train document (a verbatim leak, "
            "e.g. repeated boilerplate or a quoted text): val/loss on it partly measures memorisation; a few "
            "among many validation documents barely move val/loss; split.decontaminate=true builds a cache "
            f"without them (docs/data.md); ids {named} (every id: verbatim_leak_ids "
            "in the JSON of inspect-data output=FILE)"
        )
    return lines


def _fmt(key: str, value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        if key in PERCENT_KEYS:
            return f"{100 * value:.2f} %"
        if key == "units_vs_concat":  # Ding et al.'s compactness: differences of 0.01 % matter
            return f"{value:.5f}"
        if key == "uses_per_epoch":
            return f"{value:.3f}"
        if key in FLOOR_KEYS:
            return f"{value:.4f}"
        return f"{value:,.1f}" if math.isfinite(value) else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def render_table(stats: dict) -> Table:
    """The statistics as a two-column table; overlap or leaks turn their rows and the caption red."""
    warnings = stats_warnings(stats)
    table = Table(
        title=f"inspect-data: policy {stats.get('policy')}, max_seq_len {stats.get('max_seq_len')}",
        caption="\n".join(warnings) or None,
        caption_style="bold red",
        min_width=max((len(line) + 4 for line in warnings), default=None),
    )
    table.add_column("statistic")
    table.add_column("value", justify="right")
    loud = {"train_validation_overlap", "verbatim_leaks"}
    for key, value in stats.items():
        if key in ("policy", "max_seq_len", "verbatim_leak_ids"):  # the ids: in the caption and JSON
            continue
        if isinstance(value, dict):  # mixture.<component>.<statistic>, floors.bigram.nats, ...
            for name, leaf, number in _leaves(key, value):
                table.add_row(name, _fmt(leaf, number))
            continue
        style = "bold red" if key in loud and value else None
        table.add_row(key, _fmt(key, value), style=style)
    return table


def _leaves(key: str, value: dict):
    """(dotted name, last key, value) of every non-dict entry below `value`."""
    for sub, item in value.items():
        if isinstance(item, dict):
            yield from _leaves(f"{key}.{sub}", item)
        else:
            yield f"{key}.{sub}", sub, item
