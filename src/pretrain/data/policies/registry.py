"""The one map from `data.policy` to its class: adding a policy is its module, its `Policy` member,
one line here and its option `conf/data/<policy>.yaml` (whose defaults list names `<policy>_schema`)."""

from __future__ import annotations

from ...errors import ConfigError
from .base import DataConfig, DataPolicy, Policy
from .bestfit import BestfitPolicy
from .firstfit import FirstfitPolicy
from .padded import PaddedPolicy
from .prepacked import PrepackedPolicy
from .vsl import VslPolicy

REGISTRY: dict[Policy, type[DataPolicy]] = {
    Policy.padded: PaddedPolicy,
    Policy.prepacked: PrepackedPolicy,
    Policy.bestfit: BestfitPolicy,
    Policy.firstfit: FirstfitPolicy,
    Policy.vsl: VslPolicy,
}


def policy_class(name: object) -> type[DataPolicy]:
    """The class of `data.policy=name`; an unknown name is refused in one line listing the choices."""
    try:
        return REGISTRY[Policy(str(name))]
    except (ValueError, KeyError):
        raise ConfigError(f"unknown data.policy {str(name)!r}; choose one of {', '.join(REGISTRY)}") from None


def build_policy(config: DataConfig) -> DataPolicy:
    """The policy object of a typed `data` group (the config's own class says which policy it is)."""
    cls = policy_class(config.policy)
    if not isinstance(config, cls.config_class):
        raise ConfigError(
            f"data.policy={config.policy} needs its own options ({cls.config_class.__name__}), got "
            f"{type(config).__name__}: choose the policy with data={config.policy}"
        )
    return cls(config)
