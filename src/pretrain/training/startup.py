"""A run's start-up: Lightning kept quiet, the typed settings built once from the config
(`RunSettings`: schema, device and checkpoint checks, nothing written yet), `ckpt_path=auto` resolved
under the run directory's lock, the checkpoint folder probed, and `start_over` applied."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from omegaconf import DictConfig

from ..checkpoints.files import AUTO, newest_valid_checkpoint
from ..config import Config, check_known_keys, to_config
from ..data.batching.mixture import MixtureSpec
from ..data.batching.policies import PolicySettings
from ..data.ingest.cache import CacheSpec
from ..data.ingest.tokenizer_json import tokenizer_vocab_size
from ..errors import CheckpointError, ConfigError
from ..model import ModelSettings, config_from_settings
from .checks import attention_backend, check_checkpoint, device_line, launch_world_size, resolve_trainer
from .progress import warn_if_slow_on_cpu
from .rundir import check_fresh_start, hydra_mode, is_rank_zero, remove_checkpoints

_NOISE = (
    "litlogger",
    "`weights_only` was not set",
    "LeafSpec",
    "GPU available",
    "TPU available",
    "`Trainer.fit` stopped",
)


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(text in record.getMessage() for text in _NOISE)


def quiet_lightning() -> None:
    """Drop Lightning's advertising and messages that do not apply to how we use it."""
    for name in (
        "lightning.pytorch.utilities.rank_zero",
        "lightning.fabric.utilities.rank_zero",
        "lightning.pytorch.trainer.connectors.checkpoint_connector",
    ):
        logging.getLogger(name).addFilter(_DropNoise())
    if logging.getLogger().handlers:
        # Under Hydra the root logger already prints (and writes train.log): Lightning's own console
        # handler would print every message a second time.
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            lightning_logger = logging.getLogger(name)
            for handler in list(lightning_logger.handlers):
                if type(handler) is logging.StreamHandler:
                    lightning_logger.removeHandler(handler)
    # Manual optimization: the checkpoint must hold the state *after* the update, which is what it gets.
    warnings.filterwarnings("ignore", message=".*ModelCheckpoint with manual optimization.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    # On a machine with Slurm installed every run outside a job got it: a local run is meant as one.
    warnings.filterwarnings(
        "ignore", message=".*The `srun` command is available on your system but is not used.*"
    )
    warnings.filterwarnings("ignore", message=".*Experiment logs directory .* exists and is not empty.*")
    # A resumed run writes to its own new output directory; nothing of the old one's top-k applies.
    warnings.filterwarnings("ignore", message=".*The dirpath has changed from.*")
    # ckpt_path=auto resumes into the run's own checkpoint folder; other checkpoint settings are fine.
    warnings.filterwarnings("ignore", message=".*Checkpoint directory .* exists and is not empty.*")
    warnings.filterwarnings(
        "ignore", message=".*callbacks used to create the checkpoint need to be provided.*"
    )


def _output_dir(configured: str | None) -> Path:
    if hydra_mode() is not None:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    return Path(configured or "outputs/manual").resolve()


def with_tokenizer_vocab(config: Config) -> Config:
    """`model.vocab_size=null` resolved to the tokenizer's ids (GPT-2's 50257 without reading its
    files); a set one must hold them all."""
    needed = tokenizer_vocab_size(config.tokenizer)
    have = config.model.vocab_size
    if have is None:
        return replace(config, model=replace(config.model, vocab_size=needed))
    if have < needed:
        raise ConfigError(
            f"model.vocab_size={have} must be >= {needed}: the tokenizer's ids go up to {needed - 1} "
            "(leave model.vocab_size unset to follow the tokenizer)"
        )
    return config


@dataclass(frozen=True)
class RunSettings:
    """What a run builds from its config, once, before any heavy work; passed down as plain values."""

    config: Config
    policy: PolicySettings
    model: ModelSettings
    cache: CacheSpec  # its identity hashes every local source file: computed here only
    mixture: MixtureSpec | None  # the components' caches, when the run mixes corpora
    attn_backend: str  # resolved: `auto` is never passed down
    output_dir: Path
    device_line: str = ""  # what trainer=auto / attn=auto chose, said once the run starts

    @classmethod
    def from_config(cls, cfg: DictConfig | Config) -> RunSettings:
        """Everything checked and built from `cfg`, nothing written, in the run directory (Hydra's, else
        `output_dir` or outputs/manual); a run too slow for the CPU warned about."""
        return cls._build(cfg, None).warned()

    @classmethod
    def _build(cls, cfg: DictConfig | Config, output_dir: Path | None) -> RunSettings:
        if isinstance(cfg, DictConfig):  # a multirun job's too (train.py checks a single run's first)
            check_known_keys(cfg)
        config = to_config(cfg)
        policy = PolicySettings.from_config(config.data, config.train, config.seed)
        backend = attention_backend(config.attn, config.trainer)
        chosen = device_line(config.attn, config.trainer, backend)  # before auto is replaced below
        config = replace(config, trainer=resolve_trainer(config.trainer))  # Lightning sees concrete values
        config = with_tokenizer_vocab(config)
        model = config_from_settings(config.model)
        if config.model.init_from and not config.ckpt_path:
            from ..hf.roundtrip import check_init_from

            check_init_from(config.model.init_from, model, config.model.extend_positions)
        mixture = MixtureSpec.from_config(config)
        if mixture is not None:
            mixture.check_policy(policy.policy)
        cache = CacheSpec.from_config(config) if mixture is None else mixture.components[0].cache
        output_dir = _output_dir(config.output_dir) if output_dir is None else output_dir
        run = cls(config, policy, model, cache, mixture, backend, output_dir, chosen)
        if config.ckpt_path != AUTO:  # auto: chosen once the run directory is locked (resolve_auto)
            check_checkpoint(
                config.ckpt_path,
                policy.max_seq_len,
                model,
                run.data_key,
                config.train.max_steps,
                policy=policy,
                world_size=launch_world_size(config.trainer),
            )
        return run

    @classmethod
    def before_run_dir(cls, config: Config) -> RunSettings:
        """train.py's launch checks (launch_checks.CheckBeforeRun): the settings built, and so the
        tokenizer, model.init_from and ckpt_path refused, before Hydra makes the run directory, whose
        path only the job knows (`in_run_dir`)."""
        quiet_lightning()  # the checkpoint checks load with torch and Lightning
        return cls._build(config, output_dir=Path())

    def in_run_dir(self) -> RunSettings:
        """These settings in the run directory Hydra made for the job (its log now open: warned)."""
        return replace(self, output_dir=_output_dir(self.config.output_dir)).warned()

    def warned(self) -> RunSettings:
        warn_if_slow_on_cpu(self.config, self.model, self.policy)  # e.g. model=gpt2-small on trainer=cpu
        return self

    @property
    def data_key(self) -> str:
        """What the checkpoint records as `cache_key`: the cache's key, or the mixture's."""
        return self.cache.key if self.mixture is None else self.mixture.key

    @property
    def data_identity(self) -> dict:
        return self.cache.identity if self.mixture is None else self.mixture.identity

    def resolve_auto(self) -> RunSettings:
        """`ckpt_path=auto` (under the run directory's lock): its newest checkpoint, checked, or None."""
        if self.config.ckpt_path != AUTO:
            return self
        found = _auto_checkpoint(self.output_dir)
        check_checkpoint(
            found,
            self.policy.max_seq_len,
            self.model,
            self.data_key,
            self.config.train.max_steps,
            verified=True,
            policy=self.policy,
            world_size=launch_world_size(self.config.trainer),
        )
        return replace(self, config=replace(self.config, ckpt_path=found))


_is_rank_zero = is_rank_zero


def _auto_checkpoint(output_dir: Path) -> str | None:
    """`ckpt_path=auto`: the newest valid checkpoint of the run directory, or a fresh start."""
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if _is_rank_zero() else (lambda text: None)
    found = newest_valid_checkpoint(output_dir)  # refuses checkpoints it cannot verify
    if found is None:
        say(f"ckpt_path=auto: no valid checkpoint in {output_dir / 'checkpoints'}, starting a new run")
        return None
    say(f"ckpt_path=auto: resuming from {found}")
    return str(found)


def _writable_checkpoint_dir(directory: Path) -> None:
    """Fail before any heavy work when checkpoints cannot be written there (not after hours)."""
    probe = directory / f".write-test-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise CheckpointError(
            f"cannot write checkpoints to {directory}: {error.strerror or error}; make it a writable "
            "directory or run elsewhere (hydra.run.dir=... or output_dir=...)"
        ) from None


def _start_over_if_asked(config: Config, output_dir: Path) -> None:
    """A run that resumes nothing never mixes with another run's checkpoints: refused, or (start_over)
    those are deleted first, in one line."""
    check_fresh_start(output_dir, config.ckpt_path, config.start_over)
    if config.start_over:
        removed = remove_checkpoints(output_dir)
        if removed:
            print(
                f"start_over=true: deleted {len(removed)} checkpoints of an earlier run in "
                f"{output_dir / 'checkpoints'}",
                file=sys.stderr,
                flush=True,
            )


def _trained(output_dir: Path) -> bool:
    return (output_dir / "metrics.csv").exists() or any((output_dir / "checkpoints").glob("*.ckpt"))
