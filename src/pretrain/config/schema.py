"""The typed config: one dataclass per group, registered with Hydra's ConfigStore as the schema of
`conf/train.yaml`, so a wrong type or an unknown key fails at composition, naming the key.

Defaults live here and nowhere else. A value that a group option chooses (the policy, the model's
size, the trainer's device) is MISSING here and set by that option's YAML file (`conf/<group>/*.yaml`),
which says nothing else. The plug-in groups (`data`, `attn`, `source`: `GROUPS`) are typed by the chosen
plug-in's own dataclass (registered under the group as `<name>_schema`), so each holds that plug-in's
options only. Each field's docstring is its documentation (`docs/config.md` is generated
from them: `python -m pretrain.config > docs/config.md`).

The run's entry turns the composed `DictConfig` into these dataclasses once (`to_config`) and builds
the settings objects of the data, model and training code from them; nothing below the entry reads
Hydra's config.
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, get_args, get_origin, get_type_hints

from hydra.errors import ConfigCompositionException as ConfigCompositionError
from omegaconf import II, MISSING, DictConfig, ListConfig, OmegaConf

# The plug-in groups' schemas live with their plug-ins (one config dataclass per policy, backend and
# source kind); the base classes are re-exported here with the rest of the schema.
from .attention_backends import BACKENDS
from .attention_backends import AttnConfig as AttnConfig
from .data.policies import REGISTRY, positive_int
from .data.policies import DataConfig as DataConfig
from .data.policies import PadTo as PadTo
from .data.policies import Strategy as Strategy
from .data.prepare_settings import Encoder as Encoder
from .data.sources import SOURCES, typed_source
from .data.sources import SourceConfig as SourceConfig
from .data.writer import TokenDtype as TokenDtype
from .errors import ConfigError
from .gpt2 import GPT2_VOCAB_SIZE
from .plugins import Registry

CONFIG_NAME = "train"
SCHEMA_NAME = "pretrain_schema"


class TokenizerSource(StrEnum):
    bundled = "bundled"
    hub = "hub"
    files = "files"


class VerifyMode(StrEnum):
    quick = "quick"
    full = "full"


class LoggerKind(StrEnum):
    csv = "csv"
    wandb = "wandb"


def _is_set(value: Any) -> bool:
    return value is not None and value != MISSING


def _at_least(key: str, value: Any, low: float) -> None:
    if _is_set(value) and value < low:
        raise ConfigError(f"{key}={value!r} must be >= {low}")


def _within(key: str, value: Any, low: float, high: float, why: str = "") -> None:
    """`low <= value <= high`, or a ConfigError giving the range (and why, when it is not obvious)."""
    if _is_set(value) and not low <= value <= high:
        raise ConfigError(f"{key}={value!r} must be in [{low}, {high}]{f' ({why})' if why else ''}")


def _valid_devices(devices: Any) -> bool:
    """Lightning's `devices`: a count >= 1, -1 (all), "auto", or a non-empty list of indices."""
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    if isinstance(devices, int) and not isinstance(devices, bool):
        return devices >= 1 or devices == -1
    return devices == "auto" or (isinstance(devices, list | tuple) and len(devices) > 0)


SEED_RANGE = (0, 2**32 - 1)
"""numpy's and Lightning's seed range."""


@dataclass
class TokenizerConfig:
    name: str = MISSING
    """hub repository of the tokenizer (source=hub; recorded in the cache identity)"""
    revision: str = MISSING
    """pinned hub revision of the tokenizer files"""
    source: TokenizerSource = TokenizerSource.bundled
    """bundled (GPT-2's files shipped offline), hub (the pinned revision) or files"""
    vocab_file: str | None = None
    """source=files: encoder.json / vocab.json"""
    merges_file: str | None = None
    """source=files: vocab.bpe / merges.txt"""


# The split's defaults are the schema's; data/split.py reads them from here (config sits below data).
DEFAULT_SPLIT_SEED = 20261003
DEFAULT_VALIDATION_FRACTION = 0.05


@dataclass
class SplitConfig:
    seed: int = DEFAULT_SPLIT_SEED
    """seed re-hashed with each document's sha256 to pick its split"""
    validation_fraction: float = DEFAULT_VALIDATION_FRACTION
    """share of documents that go to validation, in [0, 1); 0 = no validation (no val/loss)"""

    def __post_init__(self) -> None:
        fraction = self.validation_fraction
        if _is_set(fraction) and not 0.0 <= fraction < 1.0:
            hint = "1 leaves no training documents" if fraction == 1 else "it is a share of the documents"
            raise ConfigError(
                f"split.validation_fraction={fraction!r} must be in [0, 1) ({hint}): "
                f"set e.g. split.validation_fraction={DEFAULT_VALIDATION_FRACTION} (0 = no validation)"
            )


@dataclass
class BudgetConfig:
    train_tokens: int | None = None
    """raw tokens collected for train (whole documents, in source order); null = the whole source"""
    validation_tokens: int | None = None
    """raw tokens collected for validation; null = the whole source"""

    def __post_init__(self) -> None:
        if isinstance(self.train_tokens, int) and self.train_tokens < 1:
            raise ConfigError(
                f"budget.train_tokens={self.train_tokens!r} collects no training data: set a positive "
                "number of tokens, or budget.train_tokens=null for the whole source"
            )
        _at_least("budget.validation_tokens", self.validation_tokens, 0)


@dataclass
class ComponentConfig:
    """One component of a mixture: its own source (and cache), its share of the training tokens."""

    weight: float = MISSING
    """its share of the real training tokens (> 0; the weights are normalised to sum to 1)"""
    max_repeat: int = 1
    """times its documents may be used per epoch of the mixture (>= 1)"""
    source: Any = None
    """the keys of a `source` option (kind, files, ...): the component's documents, typed by its kind"""
    budget: BudgetConfig | None = None
    """its own raw-token budget; null = the run's `budget` group"""

    # Fields typed by a plug-in group's chosen dataclass (their keys are checked against it).
    typed_fields: ClassVar[dict[str, str]] = {"source": "source"}


@dataclass
class MixtureConfig:
    """`mixture=<name>` (conf/mixture/*.yaml): corpora mixed by token share (data/mixture.py)."""

    components: dict[str, ComponentConfig] = field(default_factory=dict)
    """component name -> its weight, max_repeat, source and optional budget"""

    def __post_init__(self) -> None:
        if not self.components:
            raise ConfigError("mixture.components is empty: name at least one component with a source")
        for name, component in self.components.items():
            key = f"mixture.components.{name}"
            if not name.replace("_", "").replace("-", "").isalnum():
                raise ConfigError(f"{key}: a component name is a metric name: use letters, digits, _ or -")
            weight = component.weight
            if not _is_set(weight) or isinstance(weight, bool) or not weight > 0:
                shown = f"{weight:g}" if isinstance(weight, int | float) else repr(weight)
                raise ConfigError(f"{key}.weight must be > 0, got {shown}")
            if not math.isfinite(weight):  # inf > 0: the shares would be inf/inf (arbitrary)
                raise ConfigError(f"{key}.weight must be a finite number > 0, got {weight:g}")
            repeat = component.max_repeat
            if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
                raise ConfigError(f"{key}.max_repeat must be an integer >= 1, got {repeat!r}")
            if component.source is None:
                raise ConfigError(f"{key}.source.kind is missing: give the keys of a source option")
            component.source = typed_source(component.source, f"{key}.source")


@dataclass
class CacheConfig:
    rebuild: bool = False
    """rebuild a cache that fails verification instead of stopping"""
    token_dtype: TokenDtype = TokenDtype.auto
    """tokens on disk: auto (uint16 when every tokenizer id is below 65,536), uint16, uint32 (identity)"""
    verify: VerifyMode = VerifyMode.quick
    """reuse check: quick (manifest, sizes, stats; re-hash what changed) or full (all sha256)"""


@dataclass
class PrepareConfig:
    num_proc: int | None = None
    """prepare worker processes; null = the usable cores (small local sources: one); the cache is the same"""
    encoder: Encoder = Encoder.auto
    """GPT-2 ids of document bodies: auto (tiktoken when it fits the files, else tokenizers); same ids"""
    tasks: int = 1
    """prepare the source as this many tasks (one per shard, e.g. SLURM jobs), then assemble their parts"""
    task: int | None = None
    """with tasks > 1: encode only this shard (0..tasks-1) into the staging dir; null = assemble the cache"""

    def __post_init__(self) -> None:
        _at_least("prepare.num_proc", self.num_proc, 1)
        _at_least("prepare.tasks", self.tasks, 1)
        task, tasks = self.task, self.tasks
        if isinstance(task, int) and isinstance(tasks, int) and not 0 <= task < tasks:
            raise ConfigError(f"prepare.task={task!r} must be in 0..{tasks - 1} (prepare.tasks={tasks})")


@dataclass
class ModelConfig:
    name: str = MISSING
    """the size's name (tiny, gpt2-small, gpt2-medium): a label, the sizes are the fields below"""
    n_layer: int = MISSING
    """transformer blocks"""
    n_head: int = MISSING
    """attention heads (d_model must be divisible by it)"""
    d_model: int = MISSING
    """residual width"""
    dropout: float = 0.0
    """embedding and residual dropout (attention has none: the kernels must be interchangeable)"""
    vocab_size: int = GPT2_VOCAB_SIZE
    """rows of the (tied) embedding"""
    bias: bool = True
    """biases in linear layers and LayerNorms (GPT-2 has them)"""
    max_seq_len: int = II("data.max_seq_len")
    """learned positions; follows data.max_seq_len"""
    init_from: str | None = None
    """a local Hugging Face GPT-2 directory (config.json + model.safetensors) to start training from"""
    extend_positions: bool = False
    """init_from: allow data.max_seq_len past its position table (extra positions start fresh)"""

    def __post_init__(self) -> None:
        # The one place for the model's range errors (GPTConfig only asserts them as invariants).
        for key in ("n_layer", "n_head", "d_model"):
            _at_least(f"model.{key}", getattr(self, key), 1)
        if _is_set(self.d_model) and _is_set(self.n_head) and self.d_model % self.n_head:
            raise ConfigError(
                f"model.d_model={self.d_model} must be divisible by model.n_head={self.n_head}: "
                "each head gets d_model / n_head channels"
            )
        if _is_set(self.dropout) and not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout={self.dropout!r} must be in [0, 1)")
        if _is_set(self.vocab_size) and self.vocab_size < GPT2_VOCAB_SIZE:
            raise ConfigError(
                f"model.vocab_size={self.vocab_size!r} must be >= {GPT2_VOCAB_SIZE}: the GPT-2 tokenizer's "
                f"ids go up to {GPT2_VOCAB_SIZE - 1} (a larger value pads the embedding, e.g. 50304)"
            )


@dataclass
class TrainerConfig:
    accelerator: str = MISSING
    """Lightning accelerator: cpu, gpu or auto (a CUDA GPU when there is one, else the CPU)"""
    devices: Any = MISSING
    """Lightning devices: a count, -1 for all, or a list of indices"""
    num_nodes: int = 1
    """machines of a multi-node run"""
    strategy: str = MISSING
    """Lightning strategy: auto, ddp, fsdp"""
    precision: str = MISSING
    """Lightning precision: 32-true, bf16-mixed, 16-mixed or auto (bf16-mixed on a GPU, fp16 before
    Ampere; 32-true on the CPU)"""
    peak_tflops: float | None = None
    """one device's peak TFLOP/s for train/mfu; null = looked up for known GPUs (no MFU on CPU)"""

    def __post_init__(self) -> None:
        devices = self.devices
        valid = _valid_devices(devices)
        if _is_set(devices) and not valid:
            raise ConfigError(
                f"trainer.devices={devices!r} must be a count >= 1, -1 (all), auto or a list of device "
                "indices, e.g. trainer.devices=1"
            )
        _at_least("trainer.num_nodes", self.num_nodes, 1)
        if _is_set(self.peak_tflops) and self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ConfigError(f"trainer.peak_tflops={self.peak_tflops!r} must be > 0 (or null)")


@dataclass
class LoggerConfig:
    kind: LoggerKind = MISSING
    """csv (metrics.csv only) or wandb (metrics.csv and Weights & Biases)"""
    project: str = "pretrain"
    """W&B project"""
    entity: str | None = None
    """W&B entity (team or user); null = the key's default"""
    group: str | None = None
    """W&B group; null = the multirun's sweep directory, else experiment_name"""
    tags: list[str] = field(default_factory=list)
    """extra W&B tags (policy, attn and model are always added)"""
    mode: str | None = None
    """online, offline or disabled; null = offline without an API key"""

    def __post_init__(self) -> None:
        if self.mode not in (None, "online", "offline", "disabled") and _is_set(self.mode):
            raise ConfigError(f"logger.mode={self.mode!r} must be online, offline, disabled or null")


DEFAULT_WARMUP_STEPS = 20
_SAID: set[str] = set()


def _say_once(text: str) -> None:
    """A note about the config, once per process (the config is typed more than once) and on rank 0."""
    if text in _SAID or any(os.environ.get(k, "0") != "0" for k in ("RANK", "LOCAL_RANK", "SLURM_PROCID")):
        return
    _SAID.add(text)
    print(text, file=sys.stderr, flush=True)


def default_warmup(max_steps: int) -> int:
    """train.warmup_steps left unset: 20 updates, scaled down to a tenth of a shorter run (a default
    must not refuse `train.max_steps=8`; a warmup the user sets is checked as given)."""
    if DEFAULT_WARMUP_STEPS <= max_steps:
        return DEFAULT_WARMUP_STEPS
    scaled = max_steps // 10
    _say_once(
        f"train.warmup_steps: the default {DEFAULT_WARMUP_STEPS} is more than train.max_steps={max_steps}; "
        f"warming up for {scaled} updates instead (set train.warmup_steps to choose)"
    )
    return scaled


@dataclass
class TrainConfig:
    batch_size: int | None = 4
    """packs (or padded rows; vsl: units of max_seq_len tokens) per microbatch"""
    microbatch_tokens: int | None = None
    """alternative to batch_size (batch_size = microbatch_tokens // max_seq_len; vsl: a multiple of it); set
    only one"""
    packing_buffer: int | None = None
    """moved to data.packing_buffer (setting it here is an error that says so)"""
    accumulation: int = 1
    """microbatches per optimizer update"""
    eval_microbatch_tokens: int = 8192
    """tokens per validation microbatch"""
    eval_packing_buffer: int = 64
    """validation chunks are best fit into packs in index order from this many candidates (every policy
    that packs validation; padded scores one chunk per row)"""
    max_steps: int = 200
    """optimizer updates to train (an upper bound when max_tokens is set)"""
    max_tokens: int | None = None
    """stop after the update that reaches this many real training tokens (all ranks), whatever the
    policy, so runs compare at equal real tokens; null = train.max_steps alone decides"""
    lr: float = 3.0e-3
    """peak learning rate (AdamW)"""
    warmup_steps: int | None = None
    """linear warmup updates, then cosine decay to min_lr_ratio x lr at max_steps; null = 20, or
    max_steps // 10 for a run shorter than that (said in one line)"""
    min_lr_ratio: float = 0.1
    """final learning rate / peak learning rate"""
    weight_decay: float = 0.1
    """AdamW weight decay of matrices and embeddings (biases and LayerNorm weights get none)"""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """AdamW betas"""
    grad_clip: float | None = 1.0
    """gradient norm clipping; null = none"""
    val_every_n_steps: int = 50
    """validate every N optimizer steps (and at the last one)"""
    val_batches: int | None = 4
    """validation microbatches per rank; null = the whole validation split"""
    checkpoint_every_n_steps: int | None = 100
    """save a checkpoint every N optimizer steps; null = only last.ckpt at the end"""
    keep_checkpoints: int | None = 2
    """periodic checkpoints kept, the newest N by step; last.ckpt is always kept and stands for the final
    step's (no two files for one step); null = keep every one"""
    log_every_n_steps: int = 5
    """write metrics every N optimizer steps (validation steps always)"""
    deterministic: bool = False
    """torch deterministic algorithms (slower; restored after the run)"""

    def __post_init__(self) -> None:
        for key in (
            "max_steps",
            "val_every_n_steps",
            "checkpoint_every_n_steps",
            "keep_checkpoints",
            "log_every_n_steps",
        ):
            _at_least(f"train.{key}", getattr(self, key), 1)
        _at_least("train.warmup_steps", self.warmup_steps, 0)
        if self.warmup_steps is None and _is_set(self.max_steps):
            default_warmup(self.max_steps)  # says so when it scales down (the field stays null)
        _at_least("train.max_tokens", self.max_tokens, 1)  # null: no token budget
        self._check_batching()
        if _is_set(self.lr) and not self.lr > 0:
            raise ConfigError(f"train.lr={self.lr!r} must be > 0")
        _within("train.min_lr_ratio", self.min_lr_ratio, 0.0, 1.0, "the final learning rate / the peak")
        _at_least("train.weight_decay", self.weight_decay, 0.0)
        if _is_set(self.grad_clip) and self.grad_clip is not None and not self.grad_clip > 0:
            raise ConfigError(f"train.grad_clip={self.grad_clip!r} must be > 0, or null for no clipping")
        warmup = self.warmup_steps
        if warmup is not None and _is_set(warmup) and _is_set(self.max_steps) and warmup > self.max_steps:
            raise ConfigError(
                f"train.warmup_steps={self.warmup_steps} must be <= train.max_steps={self.max_steps} "
                "(the learning rate would never reach its peak)"
            )
        betas = self.betas
        if _is_set(betas) and (len(betas) != 2 or not all(_is_set(b) and 0.0 <= b < 1.0 for b in betas)):
            raise ConfigError(f"train.betas={list(betas)!r} must be two numbers in [0, 1), e.g. [0.9,0.95]")

    @property
    def warmup(self) -> int:
        """The warmup the schedule uses: train.warmup_steps, or its default for this run's length."""
        return self.warmup_steps if self.warmup_steps is not None else default_warmup(self.max_steps)

    def _check_batching(self) -> None:
        """How microbatches are sized (the data path's knobs of this group), checked once here."""
        if self.packing_buffer is not None:
            owners = [
                f"data={p}"
                for p, c in REGISTRY.items()
                if "packing_buffer" in c.config_class.__dataclass_fields__
            ]
            raise ConfigError(
                "train.packing_buffer moved to the data group: set "
                f"data.packing_buffer={self.packing_buffer} instead (an option of {', '.join(owners)})"
            )
        batch_size, microbatch_tokens = self.batch_size, self.microbatch_tokens
        if _is_set(batch_size) and _is_set(microbatch_tokens):
            raise ConfigError(
                "set only one of train.batch_size and train.microbatch_tokens (e.g. train.batch_size=null)"
            )
        if batch_size is None and microbatch_tokens is None:
            raise ConfigError(
                "set one of train.batch_size (packs per microbatch) and train.microbatch_tokens"
            )
        for key in (
            "batch_size",
            "microbatch_tokens",
            "eval_microbatch_tokens",
            "eval_packing_buffer",
            "val_batches",
            "accumulation",
        ):
            if _is_set(getattr(self, key)):
                positive_int(getattr(self, key), f"train.{key}")


@dataclass
class Config:
    """The root: what `python train.py` and every `pretrain` command compose."""

    experiment_name: str = "default"
    """W&B group and the label of comparisons"""
    seed: int = 1234
    """run seed: sampler order and initial weights"""
    cache_root: str = "data-cache"
    """where caches live (env PRETRAIN_CACHE_ROOT overrides)"""
    ckpt_path: str | None = None
    """resume model, optimizer and sampler state from this checkpoint; auto = the run dir's newest valid"""
    start_over: bool = False
    """a new run where another run left checkpoints: delete them first (else refused; or resume it)"""
    output_dir: str | None = None
    """run directory outside @hydra.main (tests, notebooks); under Hydra its run dir is used"""
    record_batches: bool = False
    """write batches.rank<R>.jsonl: what each rank trained on, per update"""
    progress_bar: bool = True
    """Rich progress bar while training"""
    source: SourceConfig = field(default_factory=SourceConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    data: DataConfig = field(default_factory=DataConfig)
    attn: AttnConfig = field(default_factory=AttnConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    mixture: MixtureConfig | None = None
    """corpora mixed by token share (`mixture=<name>`); null = the one `source`"""

    def __post_init__(self) -> None:
        if _is_set(self.seed) and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise ConfigError(f"seed={self.seed!r} must be in [{SEED_RANGE[0]}, {SEED_RANGE[1]}]")
        if self.start_over is True and self.ckpt_path is not None:
            raise ConfigError(
                f"start_over=true deletes the run directory's checkpoints, ckpt_path={self.ckpt_path} "
                "resumes one: choose one of them"
            )
        tokens, length = self.train.microbatch_tokens, self.data.max_seq_len
        if _is_set(tokens) and tokens is not None and _is_set(length) and tokens < length:
            raise ConfigError(
                f"train.microbatch_tokens={tokens} is less than one row of data.max_seq_len={length}: set "
                f"train.microbatch_tokens>={length}, or train.batch_size instead"
            )
        # A policy may refuse how the train group sizes a microbatch
        # (vsl: train.microbatch_tokens must be a whole number of max_seq_len units).
        train, data = self.train, self.data
        if _is_set(data.max_seq_len) and (_is_set(train.batch_size) or _is_set(train.microbatch_tokens)):
            data.microbatch_units(train.batch_size, train.microbatch_tokens)


# --- Hydra ----------------------------------------------------------------------------------------


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


# Keys that moved: a run config saved before the move (a checkpoint's) is read with the new names.
MOVED_KEYS = {"train.packing_buffer": "data.packing_buffer"}
# Keys that some plug-ins of a group had and lost (not a sign of a config from before the group split):
# data.packing_buffer was every packing policy's validation buffer, now train.eval_packing_buffer.
LEFT_KEYS = {"data": ("packing_buffer",)}


def _own_keys(node: DictConfig, group: str) -> DictConfig | dict:
    """The keys of a saved plug-in group that its plug-in has an option for (the others dropped: every
    policy's options, or every source kind's, used to live in one group)."""
    schema = group_schema(OmegaConf.create({group: node}), group)
    if schema is GROUPS[group].base:
        return node
    own = {f.name for f in fields(schema)}
    if set(node) - own - set(LEFT_KEYS.get(group, ())):  # saved when the group held every plug-in's
        own -= set(getattr(schema, "gained_since_split", ()))  # options: these keys were another's
    return {k: v for k, v in node.items() if k in own}


def upgrade_run_config(saved: dict) -> dict:
    """A run config as an older pretrain saved it (`run_config` of a checkpoint), in today's schema:
    moved keys under their new names, and the keys of a plug-in group (data, attn, source, a mixture
    component's source) that its plug-in has no option for dropped. Today's configs pass unchanged."""
    root = OmegaConf.create(saved)
    for old, new in MOVED_KEYS.items():
        group, key = old.split(".")
        if group in root and key in root[group]:
            value = root[group].pop(key)
            if value is not None and OmegaConf.select(root, new) is None:
                OmegaConf.update(root, new, value, force_add=True)
    buffer = OmegaConf.select(root, "data.packing_buffer")
    if buffer is not None and "train" in root and "eval_packing_buffer" not in root.train:
        root.train.eval_packing_buffer = buffer  # validation packs were best fit from it, then
    for group in GROUPS:
        if isinstance(root.get(group), DictConfig):
            root[group] = _own_keys(root[group], group)
    components = OmegaConf.select(root, "mixture.components")
    for component in (components or {}).values():
        if isinstance(component.get("source"), DictConfig):
            component.source = _own_keys(component.source, "source")
    upgraded = OmegaConf.to_container(root)
    assert isinstance(upgraded, dict)
    return upgraded


def config_dir() -> Path:
    """`conf/` of the repository (editable install), else env PRETRAIN_CONFIG_DIR, else ./conf."""
    env = os.environ.get("PRETRAIN_CONFIG_DIR")
    candidates = [Path(env)] if env else []
    candidates += [Path(__file__).resolve().parents[2] / "conf", Path.cwd() / "conf"]
    for candidate in candidates:
        if (candidate / f"{CONFIG_NAME}.yaml").is_file():
            return candidate.resolve()
    searched = ", ".join(map(str, candidates))
    raise ConfigError(f"no {CONFIG_NAME}.yaml in {searched}; set PRETRAIN_CONFIG_DIR to the conf/ folder")


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
    return f"no such key; {_where(cls, parents)} has: {', '.join(f.name for f in fields(cls))}"


def check_known_keys(cfg: DictConfig) -> None:
    """Every key of the composed config is one its schema holds (a plug-in group: its plug-in's)."""
    schemas = group_schemas(cfg)
    tree = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(tree, dict)

    def refuse(path: str, cls: type, prefix: str) -> None:
        where = _where(cls, prefix.rstrip(".").split(".") if prefix else [])
        raise UnknownKeyError(f"{path}: no such key; {where} has: {', '.join(f.name for f in fields(cls))}")

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


# --- documentation --------------------------------------------------------------------------------


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a schema dataclass (read from the source), inherited ones too."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not is_dataclass(klass):
            continue
        body = ast.parse(inspect.getsource(klass)).body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, body[1:], strict=False):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                    docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def schema_rows(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, doc) of every leaf key under `cls`, in schema order."""
    rows = []
    docs = field_docs(cls)
    hints = get_type_hints(cls)
    defaults = OmegaConf.to_container(OmegaConf.structured(cls), resolve=False)
    assert isinstance(defaults, dict)
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        node = hints[f.name]
        if node in BASES:
            rows += _group_rows(BASES[node], f"{key}.")
            continue
        if isinstance(node, type) and is_dataclass(node):
            rows += schema_rows(node, f"{key}.")
            continue
        raw = defaults[f.name]
        shown = "set by the group" if raw == MISSING else raw if isinstance(raw, str) else json.dumps(raw)
        rows.append((key, shown, docs.get(f.name, "")))
    return rows


def _group_rows(typed: TypedGroup, prefix: str) -> list[tuple[str, str, str]]:
    """A plug-in group's keys: the base's, then each plug-in's own options (a shared one once)."""
    rows: dict[str, tuple[str, str, str]] = {}
    classes: list[type] = [typed.base, *typed.registry.config_classes().values()]
    for cls in classes:
        for row in schema_rows(cls, prefix):
            rows.setdefault(row[0], row)
    return list(rows.values())


def markdown_reference() -> str:
    lines = [
        "# Config reference",
        "",
        "Generated from `src/pretrain/config.py` (`python -m pretrain.config > docs/config.md`).",
        "Group options (`conf/<group>/*.yaml`) set the keys marked `set by the group`.",
        "",
        "| key | default | meaning |",
        "|---|---|---|",
    ]
    lines += [f"| `{key}` | `{default}` | {doc} |" for key, default, doc in schema_rows()]
    lines += ["", "## Group options", "", "| group | options (`group=option`) |", "|---|---|"]
    for group in sorted(p for p in config_dir().iterdir() if p.is_dir() and p.name != "hydra"):
        options = ", ".join(f"`{f.stem}`" for f in sorted(group.glob("*.yaml")))
        lines.append(f"| `{group.name}` | {options} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_reference(), end="")
