"""compare.json: every number of compare.md's tables, machine-readable (docs/statistics.md#comparejson).

`arms` (label, layout, settings: the keys the arms differ in, seeds, runs, n, and per metric key the
mean, std and n over the seeds), `comparisons` (each arm against the reference arm per metric: the
arms' table), `contrasts` (contrast_render.CONTRAST_FIELDS: each level against the reference level in
each cell, and the pooled lines), `cells_missing`, `budgets`, `floors`, `left_out` and `files`. Numbers
are numbers; null where a value does not exist (no test, a run that never validated)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..fileio import write_text_atomic
from .arm_table import ArmTable
from .arms import Arm, flat_config
from .contrast_render import contrast_record
from .contrasts import ContrastTable, spelled, varied_factors

SCHEMA_VERSION = 1


def _number(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _arms(arms: list[Arm], table: ArmTable) -> list[dict]:
    keys = varied_factors(arms)
    records: list[dict[str, Any]] = []
    for arm in arms:
        flat = flat_config(arm.config)
        settings = {key: spelled(flat[key]) for key in keys if key in flat}
        records.append(
            {
                "label": arm.label,
                "layout": arm.layout,
                "settings": settings,
                "seeds": list(arm.seeds),
                "runs": [str(run.path) for run in arm.runs],
                "n": arm.n,
                "means": {},
                "std": {},
                "n_by_metric": {},
            }
        )
    by_arm = {id(arm): record for arm, record in zip(arms, records, strict=True)}
    for section in table.sections:
        for row in section.rows:
            record = by_arm[id(row.arm)]
            record["means"][section.metric.key] = _number(row.summary.mean)
            record["std"][section.metric.key] = _number(row.summary.std)
            record["n_by_metric"][section.metric.key] = row.summary.n
    return records


def _comparisons(table: ArmTable) -> list[dict]:
    rows = []
    for section in table.sections:
        for row in section.rows:
            c = row.comparison
            if c is None or table.reference is None:
                continue
            rows.append(
                {
                    "metric": section.metric.key,
                    "at": _number(section.metric.at),
                    "arm": row.arm.label,
                    "reference": table.reference.label,
                    "n": c.n,
                    "n_reference": c.n_reference,
                    "diff": _number(c.diff),
                    "ci_low": _number(c.low),
                    "ci_high": _number(c.high),
                    "p": _number(c.p),
                    "p_holm": _number(c.holm),
                    "mde": _number(c.mde),
                    "test": c.test,
                }
            )
    return rows


def compare_document(
    arms: list[Arm], table: ArmTable, contrasts: ContrastTable | None, files: list[Path]
) -> dict:
    """The whole comparison as one JSON-ready dict."""
    return {
        "schema": SCHEMA_VERSION,
        "reference": table.reference.label if table.reference else None,
        "paired": table.paired,
        "metrics": [
            {"key": s.metric.key, "name": s.metric.name, "at": _number(s.metric.at)} for s in table.sections
        ],
        "arms": _arms(arms, table),
        "comparisons": _comparisons(table),
        "factor": contrasts.factor if contrasts else None,
        "contrast_reference": contrasts.reference if contrasts else None,
        "cell_keys": contrasts.keys if contrasts else [],
        "contrasts": [contrast_record(c) for c in contrasts.contrasts] if contrasts else [],
        "cells_missing": [
            {"setting": setting, "levels": levels}
            for setting, levels in (contrasts.missing if contrasts else [])
        ],
        "budgets": [
            {
                "arm": b.arm.label,
                "updates": _number(b.updates),
                "real_tokens": _number(b.real_tokens),
                "computed_tokens": _number(b.computed_tokens),
                "seconds": _number(b.seconds),
            }
            for b in table.budgets
        ],
        "floors": [
            {
                "arm": f.arm.label,
                "unigram": _number(f.unigram),
                "bigram": _number(f.bigram),
                "bigram_kn": _number(f.bigram_kn),
                "gate": _number(f.gate),
                "below_bigram": f.below_bigram,
                "judged": f.judged,
            }
            for f in table.floors
        ],
        "left_out": [
            {"metric": s.metric.key, "run": str(run.path), "why": s.metric.missing}
            for s in table.sections
            for run in s.left_out
        ],
        "files": [str(path) for path in files],
    }


def write_compare_json(path: Path, document: dict) -> None:
    write_text_atomic(path, json.dumps(document, indent=2, allow_nan=False) + "\n")
