"""The config reference, generated from the schema: each field's docstring (`docs/config.md`, written
by `python -m pretrain.config > docs/config.md`)."""

from __future__ import annotations

import ast
import inspect
import json
from dataclasses import fields, is_dataclass
from typing import get_type_hints

from omegaconf import MISSING, OmegaConf

from .location import config_dir
from .plugin_groups import BASES, TypedGroup
from .schema import Config


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a schema dataclass (read from the source), inherited ones too."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not is_dataclass(klass):
            continue
        body = ast.parse(inspect.getsource(klass)).body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, body[1:], strict=False):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                    docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def schema_rows(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, doc) of every leaf key under `cls`, in schema order."""
    rows = []
    docs = field_docs(cls)
    hints = get_type_hints(cls)
    defaults = OmegaConf.to_container(OmegaConf.structured(cls), resolve=False)
    assert isinstance(defaults, dict)
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        node = hints[f.name]
        if node in BASES:
            rows += _group_rows(BASES[node], f"{key}.")
            continue
        if isinstance(node, type) and is_dataclass(node):
            rows += schema_rows(node, f"{key}.")
            continue
        raw = defaults[f.name]
        shown = "set by the group" if raw == MISSING else raw if isinstance(raw, str) else json.dumps(raw)
        rows.append((key, shown, docs.get(f.name, "")))
    return rows


def _group_rows(typed: TypedGroup, prefix: str) -> list[tuple[str, str, str]]:
    """A plug-in group's keys: the base's, then each plug-in's own options (a shared one once)."""
    rows: dict[str, tuple[str, str, str]] = {}
    classes: list[type] = [typed.base, *typed.registry.config_classes().values()]
    for cls in classes:
        for row in schema_rows(cls, prefix):
            rows.setdefault(row[0], row)
    return list(rows.values())


def markdown_reference() -> str:
    lines = [
        "# Config reference",
        "",
        "Generated from the schema, `src/pretrain/config/` (`python -m pretrain.config > docs/config.md`).",
        "Group options (`conf/<group>/*.yaml`) set the keys marked `set by the group`.",
        "",
        "| key | default | meaning |",
        "|---|---|---|",
    ]
    lines += [f"| `{key}` | `{default}` | {doc} |" for key, default, doc in schema_rows()]
    lines += ["", "## Group options", "", "| group | options (`group=option`) |", "|---|---|"]
    for group in sorted(p for p in config_dir().iterdir() if p.is_dir() and p.name != "hydra"):
        options = ", ".join(f"`{f.stem}`" for f in sorted(group.glob("*.yaml")))
        lines.append(f"| `{group.name}` | {options} |")
    return "\n".join(lines) + "\n"
