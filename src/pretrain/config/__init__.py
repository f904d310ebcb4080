"""The typed config, by job: `schema` (the root and the train group) and `groups` (the other groups),
`plugin_groups` (data, attn and source, typed by the chosen plug-in), `compose` (Hydra's compose with
the schema, `to_config`), `migrate` (every old key and old state read in today's schema),
`reference` (docs/config.md, generated from the fields' docstrings) and `location` (where conf/ is).

The run's entry turns the composed `DictConfig` into these dataclasses once (`to_config`) and builds
the settings objects of the data, model and training code from them; nothing below the entry reads
Hydra's config.
"""

from ..attention_backends import AttnConfig
from ..data.batching.policies import DataConfig, PadTo, Strategy
from ..data.ingest.prepare_settings import Encoder
from ..data.ingest.writer import TokenDtype
from ..data.sources import SourceConfig
from .checks import SEED_RANGE
from .compose import (
    UnknownKeyError,
    check_choices,
    check_known_keys,
    load_config,
    to_config,
    with_group_option,
)
from .groups import (
    DEFAULT_SPLIT_SEED,
    DEFAULT_VALIDATION_FRACTION,
    BudgetConfig,
    CacheConfig,
    ComponentConfig,
    EvalConfig,
    LoggerConfig,
    LoggerKind,
    MixtureConfig,
    ModelConfig,
    PrepareConfig,
    SplitConfig,
    TaskConfig,
    TokenizerConfig,
    TokenizerSource,
    TrainerConfig,
    VerifyMode,
)
from .location import CONFIG_NAME, config_dir
from .migrate import upgrade_run_config, upgrade_sampler_state
from .plugin_groups import GROUPS, TypedGroup, group_schema, group_schemas, register_schema
from .reference import field_docs, markdown_reference, schema_rows
from .schema import (
    AUTO_VALIDATIONS,
    SCHEMA_NAME,
    Config,
    TrainConfig,
    auto_val_every,
    default_warmup,
    validation_count,
)

__all__ = [
    "AUTO_VALIDATIONS",
    "CONFIG_NAME",
    "DEFAULT_SPLIT_SEED",
    "DEFAULT_VALIDATION_FRACTION",
    "GROUPS",
    "SCHEMA_NAME",
    "SEED_RANGE",
    "AttnConfig",
    "BudgetConfig",
    "CacheConfig",
    "ComponentConfig",
    "Config",
    "DataConfig",
    "Encoder",
    "EvalConfig",
    "LoggerConfig",
    "LoggerKind",
    "MixtureConfig",
    "ModelConfig",
    "PadTo",
    "PrepareConfig",
    "SourceConfig",
    "SplitConfig",
    "TaskConfig",
    "Strategy",
    "TokenDtype",
    "TokenizerConfig",
    "TokenizerSource",
    "TrainConfig",
    "TrainerConfig",
    "TypedGroup",
    "UnknownKeyError",
    "VerifyMode",
    "auto_val_every",
    "check_choices",
    "check_known_keys",
    "config_dir",
    "default_warmup",
    "field_docs",
    "group_schema",
    "group_schemas",
    "load_config",
    "markdown_reference",
    "register_schema",
    "schema_rows",
    "to_config",
    "upgrade_run_config",
    "upgrade_sampler_state",
    "validation_count",
    "with_group_option",
]
