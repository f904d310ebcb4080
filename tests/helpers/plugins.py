"""The plug-ins' cases, read from the registries: a new policy, backend or source is covered by every
generic test without editing one (each plug-in declares its `test_variants`)."""

from __future__ import annotations

from pretrain.attention_backends import BACKENDS
from pretrain.data.batching.policies import REGISTRY
from pretrain.data.sources import SOURCES

POLICIES = list(REGISTRY)
"""Every registered data policy, in registry order."""

POLICY_VARIANTS = REGISTRY.variants()
"""case -> (policy, *overrides): every policy's test variants."""

SOURCE_KINDS = list(SOURCES)
BACKEND_CHOICES = list(BACKENDS)


def cpu_backends(training: bool) -> list[str]:
    """The registered attention backends that run on this machine's CPU (eval or training)."""
    import torch

    from pretrain.errors import ConfigError
    from pretrain.model.attention import REGISTRY as ATTENTION
    from pretrain.model.attention import check_backend

    able = []
    for name in ATTENTION:
        try:
            check_backend(name, "cpu", torch.float32, training=training)
        except ConfigError:
            continue
        able.append(name)
    return able


def one_variant_per_policy() -> list[str]:
    """The first variant of each policy (tests that cost a run per case)."""
    first: dict[str, str] = {}
    for case, (policy, *_) in POLICY_VARIANTS.items():
        first.setdefault(policy, case)
    return list(first.values())


def policies_where(**traits: object) -> list[str]:
    """The policies whose class has these trait values (e.g. mixes=True, whole_updates=False)."""
    return [name for name, cls in REGISTRY.items() if all(getattr(cls, k) == v for k, v in traits.items())]


def packing_policies() -> list[str]:
    """The policies whose options include the document mask (they pack chunks)."""
    from pretrain.data.batching.policies import PackingConfig

    return [name for name, cls in REGISTRY.items() if issubclass(cls.config_class, PackingConfig)]


def golden_variants() -> dict[str, tuple[str, ...]]:
    """case -> (policy, *overrides) of every recorded golden case (tests/golden/batches.json)."""
    cases: dict[str, tuple[str, ...]] = {}
    for name, cls in REGISTRY.items():
        for case, overrides in cls.golden_variants.items():
            cases[case] = (name, *overrides)
    return cases
