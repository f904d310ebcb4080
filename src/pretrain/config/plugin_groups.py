"""The plug-in groups (data, attn, source): each typed by its chosen plug-in's dataclass, registered in
Hydra's ConfigStore under the group as `<name>_schema` (conf/<group>/<name>.yaml lists it first)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

from ..attention_backends import BACKENDS, AttnConfig
from ..data.batching.policies import REGISTRY, DataConfig
from ..data.sources import SOURCES, SourceConfig
from ..plugins import Registry
from .schema import SCHEMA_NAME, Config


@dataclass(frozen=True)
class TypedGroup:
    """A group typed by its chosen plug-in's dataclass: `<group>=<name>` (conf/<group>/<name>.yaml)
    lists `<name>_schema` first, which the registry's `config_classes()` name."""

    group: str  # the group (data, attn, source)
    key: str  # the key inside it that names the plug-in (policy, backend, kind)
    base: type  # what every plug-in of the group has (the type of the root's field)
    registry: Registry[Any]  # name -> plug-in (with a config_class)

    def schema_of(self, name: object) -> type:
        """The dataclass of the plug-in called `name` (an unknown one is refused listing the choices)."""
        return self.registry.choose(name).config_class


GROUPS = {
    "data": TypedGroup("data", "policy", DataConfig, REGISTRY),
    "attn": TypedGroup("attn", "backend", AttnConfig, BACKENDS),
    "source": TypedGroup("source", "kind", SourceConfig, SOURCES),
}
BASES = {typed.base: typed for typed in GROUPS.values()}


def register_schema() -> None:
    """Make the schema known to Hydra (`conf/train.yaml` lists it first in its defaults)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=Config)
    for typed in GROUPS.values():  # conf/<group>/<name>.yaml lists `<name>_schema` first
        for name, cls in typed.registry.items():
            store.store(group=typed.group, name=schema_name(name), node=cls.config_class)


def schema_name(name: str) -> str:
    return f"{name}_schema"


def group_schema(cfg: DictConfig | dict, group: str) -> type:
    """The dataclass that types `group`: the one its option composed it with, else (an untyped, saved
    config) that of the plug-in it names, else the base while none is chosen."""
    typed = GROUPS[group]
    root = OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg
    composed = OmegaConf.get_type(root, group) if group in root else None
    if isinstance(composed, type) and issubclass(composed, typed.base) and composed is not typed.base:
        return composed  # its own check refuses a <group>.<key>=... that is not its plug-in
    name = OmegaConf.select(root, f"{group}.{typed.key}")
    if name is None or name == MISSING:
        return typed.base
    return typed.schema_of(name)


def group_schemas(cfg: DictConfig | dict) -> dict[type, type]:
    """Each plug-in group's base -> the dataclass that types it in `cfg`."""
    return {typed.base: group_schema(cfg, group) for group, typed in GROUPS.items()}
