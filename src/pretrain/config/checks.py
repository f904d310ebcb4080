"""The range checks the schema's dataclasses share (`__post_init__`), and the seed range."""

from __future__ import annotations

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


def _valid_devices(devices: Any) -> bool:
    """Lightning's `devices`: a count >= 1, -1 (all), "auto", or a non-empty list of indices."""
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    if isinstance(devices, int) and not isinstance(devices, bool):
        return devices >= 1 or devices == -1
    return devices == "auto" or (isinstance(devices, list | tuple) and len(devices) > 0)


SEED_RANGE = (0, 2**32 - 1)
"""numpy's and Lightning's seed range."""
