"""The range checks the schema's dataclasses share (`__post_init__`), and the seed range."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from omegaconf import MISSING, OmegaConf

from ..errors import ConfigError
from .location import config_dir


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


@dataclass(frozen=True)
class ReadBy:
    """A group whose keys are read under some options only: the key whose value chooses the option
    (`chooser`: tokenizer.source), and each such key's choices that read it. A group declares it as
    its class's `read_by`; the plug-in groups need none (each plug-in's dataclass holds only its keys)."""

    chooser: str
    keys: Mapping[str, tuple[str, ...]]


def check_read(group: str, config: Any) -> None:
    """A key of `group` set (not its default) under a choice that does not read it is refused in one
    line naming the options that do (tokenizer.file without tokenizer=json trained with GPT-2)."""
    read_by: ReadBy | None = getattr(type(config), "read_by", None)
    chosen = getattr(config, read_by.chooser, None) if read_by is not None else None
    if read_by is None or not _is_set(chosen):
        return
    for f in fields(config):
        readers, value = read_by.keys.get(f.name), getattr(config, f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if readers is None or str(chosen) in readers or not _is_set(value) or value == default:
            continue
        raise ConfigError(
            f"{group}.{f.name}={value!r}: {group}.{read_by.chooser}={chosen} does not read it; read by "
            f"{_choices(group, read_by.chooser, readers)}: choose {'it' if len(readers) == 1 else 'one'}, "
            "or drop the key"
        )


def _choices(group: str, chooser: str, values: tuple[str, ...]) -> str:
    """`tokenizer=json (tokenizer.source=file) or tokenizer.source=hub_file`: each value by the group
    option that sets it (conf/<group>/*.yaml), else by the key itself."""
    options: dict[str, list[str]] = {}
    try:
        for path in sorted((config_dir() / group).glob("*.yaml")):
            value = OmegaConf.select(OmegaConf.load(path), chooser, default=None)
            options.setdefault(str(value), []).append(f"{group}={path.stem}")
    except ConfigError:  # no conf/ here (an installed package): the keys alone
        pass
    said = [
        f"{' or '.join(options.get(v, []))} ({group}.{chooser}={v})"
        if v in options
        else f"{group}.{chooser}={v}"
        for v in values
    ]
    return " or ".join(said)


def _valid_devices(devices: Any) -> bool:
    """Lightning's `devices`: a count >= 1, -1 (all), "auto", or a non-empty list of indices."""
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    if isinstance(devices, int) and not isinstance(devices, bool):
        return devices >= 1 or devices == -1
    return devices == "auto" or (isinstance(devices, list | tuple) and len(devices) > 0)


SEED_RANGE = (0, 2**32 - 1)
"""numpy's and Lightning's seed range."""
