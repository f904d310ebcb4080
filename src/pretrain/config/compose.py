"""Composing the config: Hydra's compose with the schema (`load_config`), the checks Hydra does not do
(the plug-in choices, keys added with `+`), the typed dataclasses (`to_config`), and a group option on
an already composed config (`with_group_option`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import fields, is_dataclass
from typing import Any, get_args, get_origin, get_type_hints

from hydra.errors import ConfigCompositionException as ConfigCompositionError
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from ..errors import ConfigError
from .location import CONFIG_NAME, config_dir
from .plugin_groups import GROUPS, group_schema, group_schemas, register_schema
from .schema import Config


def with_group_option(root: DictConfig | ListConfig, group: str, option: str) -> DictConfig:
    """`group=option` on an untyped, already composed config (eval's overrides on a checkpoint's
    config): the option's file on top, without its defaults list; a plug-in group keeps only the keys
    its plug-in has (data.max_seq_len stays, another policy's options go)."""
    content = OmegaConf.load(config_dir() / group / f"{option}.yaml")
    assert isinstance(content, DictConfig)
    content.pop("defaults", None)
    merged = OmegaConf.merge(root, {group: content})
    assert isinstance(merged, DictConfig)
    if group in GROUPS:
        own = {f.name for f in fields(group_schema(merged, group))}
        merged[group] = {k: v for k, v in merged[group].items() if k in own}
    return merged


def load_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The same config `python train.py overrides...` would see. A key the schema does not hold is
    refused here, naming the keys that exist: added with `+` (which Hydra accepts and the schema would
    silently drop) or not (Hydra's "could not override", which would suggest `+`)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    register_schema()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3", job_name="pretrain"):
        try:
            cfg = compose(config_name=CONFIG_NAME, overrides=list(overrides))
        except ConfigCompositionException as error:
            refused = _HYDRA_UNKNOWN.match(str(error))
            if refused is None or "not in" not in str(error.__cause__ or ""):
                raise
            key = refused.group(1)
            # The groups' schemas as composed without that override (a plug-in group: its plug-in's).
            rest = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != key]
            try:
                schemas = group_schemas(compose(config_name=CONFIG_NAME, overrides=rest))
            except Exception:
                schemas = {}
            raise UnknownKeyError(
                f"Could not override '{key}': {_no_such_key(key, Config, schemas)}"
            ) from None
    check_choices(cfg)
    check_known_keys(cfg)
    return cfg


class UnknownKeyError(ConfigError, ConfigCompositionError):
    """A key the schema does not hold (still a Hydra composition error for code that catches those)."""


def check_choices(cfg: DictConfig) -> None:
    """Each plug-in group names a registered plug-in (`data.policy=...` given on its own included)."""
    for group, typed in GROUPS.items():
        name = OmegaConf.select(cfg, f"{group}.{typed.key}", default=None)
        if name is not None and name != MISSING and str(name) not in typed.registry:
            raise UnknownKeyError(
                f"{group}.{typed.key}={name}: no such {typed.key}; choose one of {', '.join(typed.registry)}"
            )


_HYDRA_UNKNOWN = re.compile(r"Could not override '([^']+)'")


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass a field's type names (`X`, `X | None`), else None."""
    if isinstance(hint, type) and is_dataclass(hint):
        return hint
    for arg in get_args(hint):
        if isinstance(arg, type) and is_dataclass(arg):
            return arg
    return None


def _where(cls: type, parents: Sequence[str]) -> str:
    """How a message names the group `cls` types: `data=bestfit` for a plug-in's, else its path."""
    for typed in GROUPS.values():
        if issubclass(cls, typed.base) and cls is not typed.base:
            chosen = getattr(cls, f"for_{typed.key}", None)
            if chosen is not None:
                return f"{typed.group}={chosen}"
    return ".".join(parents) or "the config's root"


def _no_such_key(key: str, root: type, schemas: Mapping[type, type] | None = None) -> str:
    """`no such key; <group> has: a, b, ...` for a dotted `key` under the schema `root` (`schemas`: a
    plug-in group's base -> the dataclass that types it)."""
    schemas = schemas or {}
    *parents, _ = key.split(".")
    cls: type | None = root
    i = 0
    while cls is not None and i < len(parents):
        hint = get_type_hints(cls).get(parents[i])
        if get_origin(hint) is dict:  # mixture.components.<name>: skip the name, then its dataclass
            cls, i = _dataclass_of(get_args(hint)[1]), i + 2
            continue
        found = _dataclass_of(hint)
        cls, i = schemas.get(found, found) if found is not None else None, i + 1
    if cls is None or i > len(parents):
        return "no such key"
    return f"no such key; {_where(cls, parents)} has: {', '.join(f.name for f in fields(cls))}{_read_by(key)}"


def _read_by(key: str) -> str:
    """For a key of a plug-in group (a mixture component's source too) that another plug-in of the
    group has: which plug-ins read it (`Registry.read_by`), else ""."""
    *parents, name = key.split(".")
    typed = GROUPS.get(parents[-1]) if parents else None
    return typed.registry.read_by(name) if typed is not None else ""


def check_known_keys(cfg: DictConfig) -> None:
    """Every key of the composed config is one its schema holds (a plug-in group: its plug-in's)."""
    schemas = group_schemas(cfg)
    tree = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(tree, dict)

    def refuse(path: str, cls: type, prefix: str) -> None:
        where = _where(cls, prefix.rstrip(".").split(".") if prefix else [])
        has = ", ".join(f.name for f in fields(cls))
        raise UnknownKeyError(f"{path}: no such key; {where} has: {has}{_read_by(path)}")

    def walk(node: dict, cls: type, prefix: str) -> None:
        hints = get_type_hints(cls)
        typed_fields = getattr(cls, "typed_fields", {})
        for key, value in node.items():
            path = f"{prefix}{key}"
            if key not in hints:
                refuse(path, cls, prefix)
            hint = hints[key]
            if not isinstance(value, dict):
                continue
            if key in typed_fields:  # typed by the plug-in its value names (a component's source)
                typed = GROUPS[typed_fields[key]]
                name = value.get(typed.key)
                if name is not None and name != MISSING:
                    walk(value, typed.schema_of(name), f"{path}.")
                continue
            if get_origin(hint) is dict:  # name -> dataclass (mixture.components)
                item = _dataclass_of(get_args(hint)[1])
                for name, entry in value.items():
                    if item is not None and isinstance(entry, dict):
                        walk(entry, item, f"{path}.{name}.")
                continue
            child = _dataclass_of(hint)
            if child is not None:
                walk(value, schemas.get(child, child), f"{path}.")

    walk(tree, Config, "")


def to_config(cfg: DictConfig | Config) -> Config:
    """The composed config as typed dataclasses (interpolations resolved, every check run)."""
    if isinstance(cfg, Config):
        return cfg
    schema = OmegaConf.structured(Config)
    for group in GROUPS:  # typed by its plug-in, also when cfg is not
        schema[group] = OmegaConf.structured(group_schema(cfg, group))
    typed = OmegaConf.merge(schema, cfg)
    config = OmegaConf.to_object(typed)
    assert isinstance(config, Config)
    return config
