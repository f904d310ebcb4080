"""The one list of data policies: adding a policy is its module (a DataPolicy with its config
dataclass and test variants), one line here and its option `conf/data/<policy>.yaml` (whose defaults
list names `<policy>_schema`)."""

from __future__ import annotations

from ....errors import ConfigError
from ....plugins import Registry
from .base import DataConfig, DataPolicy
from .bestfit import BestfitPolicy
from .firstfit import FirstfitPolicy
from .padded import PaddedPolicy
from .prepacked import PrepackedPolicy
from .vsl import VslPolicy

REGISTRY: Registry[type[DataPolicy]] = Registry(
    "data.policy",
    PaddedPolicy,
    PrepackedPolicy,
    BestfitPolicy,
    FirstfitPolicy,
    VslPolicy,
)


def policy_class(name: object) -> type[DataPolicy]:
    """The class of `data.policy=name`; an unknown name is refused in one line listing the choices."""
    return REGISTRY.choose(name)


def build_policy(config: DataConfig) -> DataPolicy:
    """The policy object of a typed `data` group (the config's own class says which policy it is)."""
    cls = policy_class(config.policy)
    if not isinstance(config, cls.config_class):
        raise ConfigError(
            f"data.policy={config.policy} needs its own options ({cls.config_class.__name__}), got "
            f"{type(config).__name__}: choose the policy with data={config.policy}"
        )
    return cls(config)
