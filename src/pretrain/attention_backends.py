"""Not in config/: model/attention/ reads this catalog too, and model and config may not import each other.

The attention backends by name, each with the dataclass of its options, listed once in `BACKENDS`.
Torch-free, so the schema (config) offers these choices and types the `attn` group by the chosen
backend's dataclass (Hydra's `<backend>_schema`, listed first in conf/attn/<backend>.yaml's defaults);
model/attention/registry.py builds the backends from the same list (each entry names the module of
model/attention/ that implements it). Adding a backend: its module there, one line in `BACKENDS` (and
its options' dataclass here when it has options), its conf/attn/<backend>.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from .errors import ConfigError
from .plugins import MISSING, Registry

AUTO = "auto"


@dataclass
class AttnConfig:
    """The `attn` group: what every backend has (a backend without options is typed by this class)."""

    backend: str = MISSING
    """auto (varlen on CUDA, sdpa elsewhere) or a registered backend (sdpa, flex, varlen, ...);
    explicit ones never change"""

    # The backend whose options this class holds (None: shared by the backends without options).
    for_backend: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        chosen, own = self.backend, type(self).for_backend
        if own is not None and chosen not in (None, MISSING) and chosen != own:
            raise ConfigError(
                f"attn.backend={chosen} does not fit the options of attn={own}: choose the backend "
                f"with attn={chosen}"
            )

    @property
    def compile_mode(self) -> bool | str:
        """What the backend compiles (`attn.compile` of the backends that have it): auto here."""
        return "auto"


@dataclass
class FlexConfig(AttnConfig):
    compile: Any = "auto"
    """flex: torch.compile flex_attention: auto (on CUDA only), true or false"""

    for_backend = "flex"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.compile not in ("auto", True, False):
            raise ConfigError(f"attn.compile must be auto, true or false; got {self.compile!r}")

    @property
    def compile_mode(self) -> bool | str:
        return self.compile


@dataclass(frozen=True)
class BackendChoice:
    """One `attn=<name>` choice: its options' dataclass and where it is implemented."""

    name: str
    config_class: type[AttnConfig] = AttnConfig
    # `<module>.<Class>` under model/attention/ (None: `auto`, which resolves to another backend).
    implementation: str | None = None
    test_variants: dict[str, tuple[str, ...]] = field(default_factory=dict)


BACKENDS: Registry[BackendChoice] = Registry(
    "attn.backend",
    BackendChoice(AUTO),
    BackendChoice("sdpa", implementation="sdpa.SdpaBackend"),
    BackendChoice(
        "flex", FlexConfig, "flex.FlexBackend", {"flex": (), "flex-eager": ("attn.compile=false",)}
    ),
    BackendChoice("varlen", implementation="varlen.VarlenBackend"),
)
