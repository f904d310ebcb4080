"""The typed config's root (`Config`) and its `train` group, registered with Hydra's ConfigStore as the
schema of `conf/train.yaml`, so a wrong type or an unknown key fails at composition, naming the key.

Defaults live in the schema and nowhere else. A value that a group option chooses (the policy, the
model's size, the trainer's device) is MISSING here and set by that option's YAML file
(`conf/<group>/*.yaml`), which says nothing else. The plug-in groups (`data`, `attn`, `source`:
plugin_groups.GROUPS) are typed by the chosen plug-in's own dataclass (registered under the group as
`<name>_schema`), so each holds that plug-in's options only. Each field's docstring is its
documentation (`docs/config.md` is generated from them: `python -m pretrain.config > docs/config.md`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, fields

from ..attention_backends import AttnConfig
from ..data.batching.policies import REGISTRY, DataConfig, positive_int
from ..data.gpt2 import GPT2_VOCAB_SIZE
from ..data.sources import SourceConfig
from ..errors import ConfigError
from .checks import SEED_RANGE, _at_least, _is_set, _within, check_finite, check_read
from .groups import (
    BudgetConfig,
    CacheConfig,
    EvalConfig,
    LoggerConfig,
    MixtureConfig,
    ModelConfig,
    PrepareConfig,
    SplitConfig,
    TaskConfig,
    TokenizerConfig,
    TrainerConfig,
)

SCHEMA_NAME = "pretrain_schema"


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


AUTO_VALIDATIONS = 5
"""train.val_every_n_steps=auto validates at most this many times a run (and at least 3 from 5 steps)."""
AUTO = "auto"


def auto_val_every(max_steps: int) -> int:
    """train.val_every_n_steps=auto: ceil(max_steps / 5), so that a run of any length validates 3 to 5
    times (every step of a run shorter than 5 updates; validation also runs at the last step)."""
    return max(1, -(-max_steps // AUTO_VALIDATIONS))


def validation_count(max_steps: int, every: int) -> int:
    """How often a run of `max_steps` updates validates: at every multiple of `every` up to max_steps,
    and at max_steps itself (once when it is both)."""
    return -(-max_steps // every)


def _auto_or_positive(key: str, value: int | str) -> int | str:
    """`auto` or an integer >= 1 (an integer given as a string too), else one ConfigError naming `key`."""
    if not _is_set(value):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ConfigError(f"{key}={value!r} must be auto or a positive integer, e.g. {key}=auto")


def _auto_or_bool(key: str, value: bool | str) -> bool | str:
    """`auto`, true or false (also given as the strings), else one ConfigError naming `key`."""
    if not _is_set(value) or isinstance(value, bool) or value == AUTO:
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(f"{key}={value!r} must be auto, true or false, e.g. {key}=auto")


LOSS_KERNELS = ("auto", "liger", "chunked")  # model/fused_loss.py's (the schema cannot import torch)
COMPILE_SCOPES = ("auto", "model", "blocks")  # model/compile.py's


@dataclass
class TrainConfig:
    batch_size: int | None = 4
    """packs (or padded rows; vsl: units of max_seq_len tokens) per microbatch"""
    microbatch_tokens: int | None = None
    """alternative to batch_size (batch_size = microbatch_tokens // max_seq_len; vsl: a multiple of it); set
    only one"""
    packing_buffer: int | None = None
    """refused: bestfit's buffer is data.packing_buffer, validation's train.eval_packing_buffer (the error
    says so)"""
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
    val_every_n_steps: int | str = AUTO
    """validate every N optimizer steps, and at the last one; auto = ceil(max_steps / 5): 3 to 5
    validations (every step of a run under 5 updates), counted on train.max_steps, also when
    train.max_tokens ends the run sooner"""
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
    compile: bool | str = AUTO
    """torch.compile the model's blocks (the token dimension dynamic, attention left to its own kernels):
    auto = on CUDA only; true also on CPU (needs a C++ compiler); false = eager"""
    activation_checkpointing: bool = False
    """recompute each block's activations in the backward instead of keeping them (less memory, about
    one more forward of compute)"""
    compile_scope: str = AUTO
    """what train.compile compiles: model = the whole trunk as one graph (attention an opaque op;
    varlen's static bound is model.max_seq_len), blocks = each block's two halves around attention;
    auto = model for attn=varlen (and auto on CUDA) without FSDP, else blocks"""
    loss_kernel: str = AUTO
    """the training loss's head + cross-entropy: auto = liger-kernel's fused linear cross-entropy on CUDA
    when installed (pip install -e '.[gpu]'), else chunked; liger = that or an error; chunked = the
    chunked head everywhere (validation always uses it)"""

    def __post_init__(self) -> None:
        for key in (
            "max_steps",
            "checkpoint_every_n_steps",
            "keep_checkpoints",
            "log_every_n_steps",
        ):
            _at_least(f"train.{key}", getattr(self, key), 1)
        self.val_every_n_steps = _auto_or_positive("train.val_every_n_steps", self.val_every_n_steps)
        self.compile = _auto_or_bool("train.compile", self.compile)
        if _is_set(self.compile_scope) and self.compile_scope not in COMPILE_SCOPES:
            raise ConfigError(
                f"train.compile_scope={self.compile_scope!r}: use one of {', '.join(COMPILE_SCOPES)}"
            )
        if _is_set(self.loss_kernel) and self.loss_kernel not in LOSS_KERNELS:
            raise ConfigError(
                f"train.loss_kernel={self.loss_kernel!r}: use one of {', '.join(LOSS_KERNELS)} "
                "(auto = the fused liger kernel on CUDA when installed)"
            )
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

    @property
    def val_every(self) -> int:
        """The validation interval the run uses: train.val_every_n_steps, or auto's for its max_steps."""
        every = self.val_every_n_steps
        return auto_val_every(self.max_steps) if every == AUTO else int(every)

    @property
    def validations(self) -> int:
        """How often a run of train.max_steps updates validates (the last step included)."""
        return validation_count(self.max_steps, self.val_every)

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
    task: TaskConfig = field(default_factory=TaskConfig)
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
    eval: EvalConfig = field(default_factory=EvalConfig)
    mixture: MixtureConfig | None = None
    """corpora mixed by token share (`mixture=<name>`); null = the one `source`"""

    def __post_init__(self) -> None:
        check_finite(self)  # every group's floats: a range check alone lets inf (and some nan) through
        for group in fields(self):  # a key its option does not read (a group that declares read_by)
            check_read(group.name, getattr(self, group.name))
        vocab = self.model.vocab_size
        gpt2_files = str(self.tokenizer.source) in ("bundled", "hub", "files")
        if gpt2_files and _is_set(vocab) and vocab is not None and vocab < GPT2_VOCAB_SIZE:
            raise ConfigError(
                f"model.vocab_size={vocab!r} must be >= {GPT2_VOCAB_SIZE}: the GPT-2 tokenizer's "
                f"ids go up to {GPT2_VOCAB_SIZE - 1} (a larger value pads the embedding, e.g. 50304)"
            )
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
