"""The one shape of a plug-in: a data policy, an attention backend or a source kind.

A plug-in has a `name` (its `group=<name>` option, conf/<group>/<name>.yaml), a `config_class` (the
dataclass of its options, which types the group) and `test_variants` (option sets that exercise its
axes: the generic tests run every plug-in's). Each kind lists its plug-ins once, in a `Registry`;
the schema's choices, Hydra's `<name>_schema` options and the tests' cases are derived from it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import fields
from typing import Protocol, TypeVar

from .errors import ConfigError

MISSING = "???"
"""omegaconf's marker of a value a group option sets (its YAML file), spelled out: no module below the
entry imports omegaconf."""


class Plugin(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def config_class(self) -> type: ...

    @property
    def test_variants(self) -> Mapping[str, tuple[str, ...]]: ...


P = TypeVar("P", bound=Plugin)


class Registry(Mapping[str, P]):
    """Plug-ins by name, in the order listed. `key` is the config key that chooses one (messages)."""

    def __init__(self, key: str, *plugins: P) -> None:
        self.key = key
        self._plugins: dict[str, P] = {}
        for plugin in plugins:
            if plugin.name in self._plugins:
                raise ValueError(f"two plug-ins are named {plugin.name!r} for {key}")
            self._plugins[plugin.name] = plugin

    def __getitem__(self, name: str) -> P:
        return self._plugins[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._plugins)

    def __len__(self) -> int:
        return len(self._plugins)

    def __repr__(self) -> str:
        return f"Registry({self.key}: {', '.join(self._plugins)})"

    def choose(self, name: object) -> P:
        """The plug-in called `name`; an unknown name is refused in one line listing the choices."""
        found = self._plugins.get(str(name))
        if found is None:
            raise ConfigError(f"unknown {self.key} {str(name)!r}; choose one of {', '.join(self._plugins)}")
        return found

    def readers(self, option: str) -> list[str]:
        """The plug-ins that have `option` (a field of their config_class), in the order listed."""
        return [
            name for name, p in self._plugins.items() if option in {f.name for f in fields(p.config_class)}
        ]

    def read_by(self, option: str) -> str:
        """What a refusal of `<group>.<option>` under another plug-in adds: `; read by data=bestfit,
        data=firstfit: choose one, or drop the key`, or "" when no plug-in reads it (a typo)."""
        group = self.key.split(".")[0]
        names = [f"{group}={name}" for name in self.readers(option)]
        if not names:
            return ""
        return f"; read by {', '.join(names)}: choose {'it' if len(names) == 1 else 'one'}, or drop the key"

    def config_classes(self) -> dict[str, type]:
        """name -> the dataclass of its options."""
        return {name: plugin.config_class for name, plugin in self._plugins.items()}

    def variants(self) -> dict[str, tuple[str, ...]]:
        """Every plug-in's test variants: case name -> (plug-in name, *overrides)."""
        cases: dict[str, tuple[str, ...]] = {}
        for name, plugin in self._plugins.items():
            for case, overrides in (plugin.test_variants or {name: ()}).items():
                if case in cases:
                    raise ValueError(f"two {self.key} test variants are named {case!r}")
                cases[case] = (name, *overrides)
        return cases
