"""What the tests share, one concern per module (`from helpers import X` works for every name):

env        the offline environment (set on import), REPO, EOS, DESIGN_KEYS
texts      English-like fixture documents (make_texts, fixture_texts, TRICKY_TEXTS)
sources    FineWeb-shaped parquet / JSON lines files
reference  independent expectations (expected_split, reference_encode, expected_cache)
configs    config composition, `pretrain prepare` runs, TINY_RUN, module_cache_root, sampler inputs
plugins    the plug-ins' test cases, read from the registries (POLICY_VARIANTS, ...)
tiny_models  tiny GPT / Llama and one packed batch (import from helpers.tiny_models)
"""

from .configs import (
    SHARED_CACHE,
    TINY_RUN,
    base_overrides,
    cache_spec,
    cli_env,
    compose,
    files_override,
    local_overrides,
    module_cache_root,
    policy_cfg,
    prepare,
    prepare_command,
    run_prepare,
    settings_of,
    split_of,
)
from .env import DESIGN_KEYS, EOS, OFFLINE_ENV, REPO
from .plugins import (
    BACKEND_CHOICES,
    POLICIES,
    POLICY_VARIANTS,
    SOURCE_KINDS,
    cpu_backends,
    golden_variants,
    one_variant_per_policy,
    packing_policies,
    policies_where,
)
from .reference import expected_cache, expected_split, reference_encode
from .sources import fineweb_rows, write_jsonl, write_parquet
from .texts import TRICKY_TEXTS, english_text, fixture_texts, make_texts

__all__ = [
    "BACKEND_CHOICES",
    "POLICIES",
    "POLICY_VARIANTS",
    "SOURCE_KINDS",
    "cpu_backends",
    "golden_variants",
    "one_variant_per_policy",
    "packing_policies",
    "policies_where",
    "SHARED_CACHE",
    "DESIGN_KEYS",
    "EOS",
    "OFFLINE_ENV",
    "REPO",
    "TINY_RUN",
    "TRICKY_TEXTS",
    "base_overrides",
    "cache_spec",
    "cli_env",
    "compose",
    "english_text",
    "expected_cache",
    "expected_split",
    "files_override",
    "fineweb_rows",
    "fixture_texts",
    "local_overrides",
    "make_texts",
    "module_cache_root",
    "policy_cfg",
    "prepare",
    "prepare_command",
    "reference_encode",
    "run_prepare",
    "settings_of",
    "split_of",
    "write_jsonl",
    "write_parquet",
]
