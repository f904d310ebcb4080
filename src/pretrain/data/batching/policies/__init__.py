"""Data policies as plug-ins: one module per policy (padded, prepacked, bestfit, firstfit, vsl), each a
class built from its own config dataclass (the `data` group's options), listed once in `registry.py`.

A policy says how an epoch's units are laid out, how a batch is gathered, what it costs and how
validation chunks are batched (`base.DataPolicy`); the generic `Sampler` (data/batching/samplers.py) owns the
epoch plan, the rank split, the cursor and the state. Shared machinery: `layout.py` (Layout,
EpochPlan, chunk tables) and `packs.py` (the prepacked policy's stored packs),
`curriculum.py` (vsl's bucket order).

Nothing here imports torch at module level (a batch is built lazily), so the config schema that
registers these dataclasses stays cheap for `pretrain prepare`.
"""

from .base import DataConfig, DataPolicy, LongDocs, PackingConfig, PackingPolicy, positive_int
from .bestfit import BestfitConfig, BestfitPolicy, bestfit_layout
from .curriculum import Curriculum
from .firstfit import FirstfitConfig, FirstfitPolicy, firstfit_layout
from .layout import EpochPlan, Layout, shuffled, split_chunks, split_fingerprint
from .packs import Strategy, load_or_build_packs, packs_path
from .padded import PaddedConfig, PaddedPolicy, PadTo
from .prepacked import PrepackedConfig, PrepackedPolicy
from .registry import REGISTRY, build_policy, policy_class
from .settings import PolicySettings
from .vsl import VslConfig, VslPolicy, decompose

__all__ = [
    "REGISTRY",
    "BestfitConfig",
    "BestfitPolicy",
    "Curriculum",
    "DataConfig",
    "DataPolicy",
    "EpochPlan",
    "FirstfitConfig",
    "FirstfitPolicy",
    "Layout",
    "LongDocs",
    "PackingConfig",
    "PackingPolicy",
    "PadTo",
    "PaddedConfig",
    "PaddedPolicy",
    "PolicySettings",
    "PrepackedConfig",
    "PrepackedPolicy",
    "Strategy",
    "VslConfig",
    "VslPolicy",
    "bestfit_layout",
    "build_policy",
    "decompose",
    "firstfit_layout",
    "load_or_build_packs",
    "packs_path",
    "policy_class",
    "positive_int",
    "shuffled",
    "split_chunks",
    "split_fingerprint",
]
