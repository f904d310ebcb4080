"""The range checks the schema's dataclasses share (`__post_init__`), and the seed range."""

from __future__ import annotations

import math
from dataclasses import fields, is_dataclass
from typing import Any

from omegaconf import MISSING

from ..errors import ConfigError


def _is_set(value: Any) -> bool:
    return value is not None and value != MISSING


def _at_least(key: str, value: Any, low: float) -> None:
    if _is_set(value) and value < low:
        raise ConfigError(f"{key}={value!r} must be >= {low}")


def _within(key: str, value: Any, low: float, high: float, why: str = "") -> None:
    """`low <= value <= high`, or a ConfigError giving the range (and why, when it is not obvious)."""
    if _is_set(value) and not low <= value <= high:
        raise ConfigError(f"{key}={value!r} must be in [{low}, {high}]{f' ({why})' if why else ''}")


def check_finite(node: Any, key: str = "", example: Any = None) -> None:
    """Every float under `node` (a schema dataclass, with its nested ones, lists and dicts) is finite:
    inf passes `x > 0` and nan passes `not x < low`, and no key of the schema means "no limit" by inf
    (those that can be unlimited say so with null). One ConfigError names the first that is not (with
    its default as the example, when it has one)."""
    if isinstance(node, float):
        if not math.isfinite(node):
            shown = f" (e.g. {key}={example!r})" if isinstance(example, float) else ""
            raise ConfigError(f"{key}={node!r} must be a finite number{shown}")
        return
    if is_dataclass(node) and not isinstance(node, type):
        children = [(f.name, getattr(node, f.name), f.default) for f in fields(node)]
    elif isinstance(node, dict):
        children = [(str(name), value, None) for name, value in node.items()]
    elif isinstance(node, list | tuple):
        children = [(f"[{i}]", value, None) for i, value in enumerate(node)]
    else:
        return
    for name, value, default in children:
        check_finite(value, f"{key}{name}" if name.startswith("[") or not key else f"{key}.{name}", default)


def _valid_devices(devices: Any) -> bool:
    """Lightning's `devices`: a count >= 1, -1 (all), "auto", or a non-empty list of indices."""
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    if isinstance(devices, int) and not isinstance(devices, bool):
        return devices >= 1 or devices == -1
    return devices == "auto" or (isinstance(devices, list | tuple) and len(devices) > 0)


SEED_RANGE = (0, 2**32 - 1)
"""numpy's and Lightning's seed range."""
