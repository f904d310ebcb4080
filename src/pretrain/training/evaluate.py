"""`pretrain eval CKPT [overrides]`: validation loss, perplexity and bits per byte of a checkpoint.

The checkpoint's own resolved config (cache, tokenizer, max_seq_len, policy) is the base; overrides go
on top (`data=padded`, `attn=sdpa`, `train.eval_microbatch_tokens=4096`). Every prediction pair of
every validation document is scored once, each chunk isolated (data/batching/evaluation.py), so the result is
the same for every `data.policy`. A mixture's checkpoint is scored on each component's validation
split (under `components.<name>`), and the top-level keys are over all of their pairs together.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from ..config import Config, config_dir, to_config, upgrade_run_config, with_group_option
from ..data.batching.evaluation import (
    document_bytes,
    evaluation_batches,
    evaluation_positions,
    evaluation_units,
)
from ..data.batching.mixture import MixtureSpec
from ..data.batching.policies import PolicySettings, split_chunks
from ..data.ingest.cache import CacheSpec
from ..data.ingest.prepare import prepare_cache
from ..data.ingest.tokenizer import token_byte_lengths
from ..data.tokens import TokenSplit
from ..errors import CheckpointError, ConfigError
from ..hf.roundtrip import check_weight_shapes, model_weights
from ..model import Decoder, build_model, config_from_dict
from ..model.attention import check_backend
from .context_use import FULL, context_lengths, context_metrics, context_sums
from .scoring import ScoringProgress, score_batches


@dataclass(frozen=True)
class Evaluation:
    loss: float  # mean cross-entropy per real target, nats
    perplexity: float
    bits_per_byte: float  # total nats / ln 2 / UTF-8 bytes of the documents' text
    targets: int
    documents: int
    nats: float
    bytes: int
    # Per bucket of the pair's input position in its document (scoring.POSITION_BUCKETS): the mean
    # loss of each bucket holding a target, and every bucket's target count.
    loss_by_position: dict[str, float] = field(default_factory=dict)
    targets_by_position: dict[str, int] = field(default_factory=dict)
    # Context use (training/context_use.py): the same pairs' loss with each target predicted from at
    # most k tokens of its own document ("1", "16", ..., and "full" = loss); the gain is k=1 - full.
    loss_by_context: dict[str, float] = field(default_factory=dict)
    context_gain: float | None = None


def evaluate(
    model: Decoder,
    split: TokenSplit,
    settings: PolicySettings,
    token_bytes,
    progress: bool = False,
    contexts: Sequence[int] = (),
) -> Evaluation:
    """Score every prediction pair of `split` (float64 sums, whatever the model's dtype), and again
    with at most k tokens of context for each k of `contexts` below max_seq_len (eval.context)."""
    device = next(model.parameters()).device
    table = split_chunks(split, settings.max_seq_len)
    units = evaluation_units(settings, table)
    total = -(-(len(units[1]) - 1) // settings.eval_batch_size)
    ticker = ScoringProgress("eval", total) if progress else None
    sums = score_batches(
        model,
        evaluation_batches(settings, split, table, units),
        device,
        ticker,
        positions=evaluation_positions(settings, split, table, units),
    )
    result = _evaluation(
        float(sums.nats),
        int(sums.targets),
        document_bytes(split, token_bytes),
        len(split),
        sums.loss_by_position(),
        sums.count_by_position(),
    )
    lengths = context_lengths(contexts, settings.max_seq_len)
    if not lengths or not result.targets:
        return result
    ticker = ScoringProgress("context use") if progress else None
    tokens = settings.eval_microbatch_tokens
    losses = {k: context_sums(model, [(split, table)], k, tokens, device, ticker).loss for k in lengths}
    return with_context(result, {k: loss for k, loss in losses.items() if loss is not None})


def with_context(result: Evaluation, losses: dict[int, float]) -> Evaluation:
    """`result` with its context-use numbers from the loss at each context length k."""
    metrics = context_metrics(losses, result.loss)
    by_context = {key.removeprefix("loss_by_context/"): v for key, v in metrics.items() if "/" in key}
    return replace(result, loss_by_context=by_context, context_gain=metrics.get("context_gain"))


def _evaluation(
    nats: float,
    targets: int,
    size: int,
    documents: int,
    loss_by_position: dict[str, float],
    targets_by_position: dict[str, int],
) -> Evaluation:
    """The numbers of `nats` over `targets` pairs of `documents` documents of `size` bytes."""
    loss = nats / targets if targets else math.nan
    return Evaluation(
        loss=loss,
        perplexity=math.exp(loss) if targets else math.nan,
        bits_per_byte=nats / math.log(2) / size if size else math.nan,
        targets=targets,
        documents=documents,
        nats=nats,
        bytes=size,
        loss_by_position=loss_by_position,
        targets_by_position=targets_by_position,
    )


def combined(parts: Sequence[Evaluation]) -> Evaluation:
    """One evaluation over the pairs of several (a mixture's components): sums of nats, targets,
    bytes and documents, the loss and bits per byte of the sums, position buckets summed."""
    nats, targets = sum(p.nats for p in parts), sum(p.targets for p in parts)
    size = sum(p.bytes for p in parts)
    counts: dict[str, int] = {}
    bucket_nats: dict[str, float] = {}
    for part in parts:
        for bucket, count in part.targets_by_position.items():
            counts[bucket] = counts.get(bucket, 0) + count
            bucket_nats[bucket] = (
                bucket_nats.get(bucket, 0.0) + part.loss_by_position.get(bucket, 0.0) * count
            )
    result = _evaluation(
        nats,
        targets,
        size,
        sum(p.documents for p in parts),
        {b: bucket_nats[b] / c for b, c in counts.items() if c},
        counts,
    )
    # Every part scores the same pairs at every context length: their target-weighted mean.
    keys = set.intersection(*(set(p.loss_by_context) for p in parts)) - {FULL} if parts else set()
    losses = {int(k): sum(p.loss_by_context[k] * p.targets for p in parts) / targets for k in keys}
    return with_context(result, losses) if losses and targets else result


def saved_config(checkpoint: dict, overrides: Sequence[str] = ()) -> Config:
    """The checkpoint's resolved config with `group=option` and `key=value` overrides on top."""
    saved = checkpoint["hyper_parameters"].get("run_config")
    if not saved:
        raise CheckpointError("the checkpoint does not record its config (written by an older pretrain)")
    # Untyped until to_config: a data=<policy> override may change the group's schema.
    root: DictConfig | ListConfig = OmegaConf.create(upgrade_run_config(saved))
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} is not key=value")
        group = config_dir() / key
        if key == "experiment":
            raise ConfigError("experiment= does not apply to eval: the checkpoint's own config is the base")
        if "." not in key and group.is_dir():
            option = group / f"{value}.yaml"
            if not option.is_file():
                choices = ", ".join(sorted(p.stem for p in group.glob("*.yaml")))
                raise ConfigError(f"{key}={value}: no such option; choose one of {choices}")
            root = with_group_option(root, key, value)
        else:
            root = OmegaConf.merge(root, OmegaConf.from_dotlist([item]))
    return to_config(root)  # type: ignore[arg-type]


def load_decoder(
    checkpoint: dict,
    config: Config,
    where: str,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> Decoder:
    """The checkpoint's model with its weights, on the attention backend its config names (checked
    for `device` and `dtype`; default the CPU in float32)."""
    device = device or torch.device("cpu")
    gpt_config = config_from_dict(checkpoint["hyper_parameters"]["model"])
    backend = check_backend(str(config.attn.backend), device, dtype, training=False)
    weights = model_weights(checkpoint)
    check_weight_shapes(weights, gpt_config, where)
    model = build_model(gpt_config, attn=backend, attn_compile=config.attn.compile_mode)
    model.load_state_dict(weights)
    return model


def evaluate_checkpoint(path: Path | str, overrides: Sequence[str] = ()) -> dict:
    """The `pretrain eval` result: loss, perplexity, bits_per_byte, targets, documents, nats, bytes,
    loss_by_position, targets_by_position, loss_by_context, context_gain, step, policy."""
    from ..checkpoints.files import load_trainer_checkpoint

    checkpoint = load_trainer_checkpoint(path)  # its record compared first, then weights_only
    config = saved_config(checkpoint, overrides)
    settings = PolicySettings.from_config(config.data, config.train, config.seed)
    gpt_config = config_from_dict(checkpoint["hyper_parameters"]["model"])
    if settings.max_seq_len > gpt_config.max_seq_len:
        raise ConfigError(
            f"data.max_seq_len={settings.max_seq_len} exceeds the model's {gpt_config.max_seq_len} positions"
        )
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32  # bf16 autocast on CUDA (varlen needs it)
    model = load_decoder(checkpoint, config, str(path), device, dtype)
    mixture = MixtureSpec.from_config(config)
    specs = (
        {None: CacheSpec.from_config(config)}
        if mixture is None
        else {c.name: c.cache for c in mixture.components}
    )
    token_bytes = token_byte_lengths(next(iter(specs.values())).tokenizer_files, gpt_config.vocab_size)
    results: dict[str | None, Evaluation] = {}
    for name, spec in specs.items():
        cache = prepare_cache(spec)
        with torch.autocast(device.type, dtype=dtype, enabled=cuda):
            split = cache.split("validation")
            results[name] = evaluate(
                model.to(device), split, settings, token_bytes, progress=True, contexts=config.eval.context
            )
    result = results[None] if mixture is None else combined(list(results.values()))
    if not result.targets:
        where = ", ".join(str(spec.directory) for spec in specs.values())
        raise ConfigError(
            f"the validation split of {where} has no prediction pairs, so there is nothing to "
            "evaluate: build the cache with split.validation_fraction>0"
        )
    out = {
        **asdict(result),
        "step": int(checkpoint.get("global_step", 0)),
        "policy": settings.policy,
        # Every validation chunk is its own segment numbered from 0, whatever data.positions trained
        # with (`trained_positions`): the scores compare models, not numberings.
        "positions": "restart",
        "trained_positions": settings.data_policy.position_numbering(),
    }
    if mixture is not None:
        out["components"] = {str(name): asdict(part) for name, part in results.items()}
    return out
