"""The Lightning module: GPT, AdamW with warmup + cosine, token-weighted updates, metrics.

Optimization is manual: one training item is one whole update, whose loss is normalised by the real
targets of all its microbatches on all ranks (see update.py). Lightning's own accumulation would
weight microbatches equally whatever their token counts.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict

import lightning as L
import numpy as np
import torch

from ..config import TrainConfig
from ..data.batching.batch import PackedBatch
from ..data.measures.audit import batch_attention_cost
from ..model import ModelSettings, build_model, config_from_dict
from ..model.compile import CompileStats
from ..model.flops import peak_flops, training_flops
from .context_use import context_lengths, context_metrics, context_sums
from .machine_load import load_per_cpu
from .model_setup import set_up_model
from .scoring import ScoreSums, ScoringProgress, score_batches
from .update import run_update


def lr_lambda(warmup_steps: int, max_steps: int, min_lr_ratio: float):
    """Linear warmup to 1, then cosine down to `min_lr_ratio` at `max_steps`."""

    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        span = max(1, max_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def update_attention_cost(microbatches: list[PackedBatch]) -> float:
    """`train/attention_cost` of one update: each microbatch's `batch_attention_cost` weighted by its
    real tokens (= the update's summed squared segment lengths per real token)."""
    real = sum(mb.real_tokens for mb in microbatches)
    return sum(batch_attention_cost(mb) * mb.real_tokens for mb in microbatches) / real if real else 0.0


def real_segment_lengths(batch: PackedBatch) -> np.ndarray:
    """Lengths attention really works on: segments of a packed batch, real tokens of a padded row."""
    if batch.padded:
        return batch.pack_lengths.numpy()
    return np.diff(batch.cu_seqlens.numpy())


def machine_load() -> dict[str, float]:
    """`sys/load_per_cpu`: the 1-minute load average over the CPUs, at this step. Near 1 when the run
    has the machine to itself (its threads are the load); well above, other work competed for the
    CPUs and its step times measure that too (report/arm_table.py marks such comparisons). Empty where
    the system has no load average."""
    load = load_per_cpu()
    return {} if load is None else {"sys/load_per_cpu": load}


def adamw_kernel(device: torch.device) -> dict:
    """AdamW's implementation: on CUDA the fused kernel (one launch for every parameter's update; the
    default foreach runs several per group), elsewhere torch's default (what CPU runs always used)."""
    return {"fused": True} if torch.device(device).type == "cuda" else {}


class PretrainModule(L.LightningModule):
    """`model` and `train` are the run's model config (GPTConfig or LlamaConfig) and `train` group (or
    their dicts, as a checkpoint's hyper-parameters hold them); `attn_backend` and `attn_compile` are
    `attn.backend` and `attn.compile`; `run_config` (the resolved config) and `cache_identity` are
    recorded for eval and export."""

    def __init__(
        self,
        model: ModelSettings | Mapping,
        train: TrainConfig | Mapping,
        attn_backend: str,
        max_seq_len: int,
        cache_key: str,
        attn_compile: bool | str = "auto",
        run_config: dict | None = None,
        cache_identity: dict | None = None,
        peak_tflops: float | None = None,
        mixture_components: list[str] | None = None,
        eval_context: Sequence[int] = (),
    ):
        super().__init__()
        self.gpt_config = config_from_dict(model) if isinstance(model, Mapping) else model
        self.settings = train if isinstance(train, TrainConfig) else TrainConfig(**train)
        self.save_hyperparameters(
            {
                "model": asdict(self.gpt_config),
                "train": asdict(self.settings),
                "attn_backend": attn_backend,
                "max_seq_len": max_seq_len,
                "cache_key": cache_key,
                "attn_compile": attn_compile,
                # What `pretrain eval` and `pretrain export` rebuild from: the resolved config and
                # the cache identity (its tokenizer's content hash names the tokenizer files).
                "run_config": run_config,
                "cache_identity": cache_identity,
                "peak_tflops": peak_tflops,
                "mixture_components": mixture_components,
                "eval_context": list(eval_context),
            }
        )
        self.automatic_optimization = False
        self.model = build_model(self.gpt_config, attn=attn_backend, attn_compile=attn_compile)
        self.tokens_seen = 0  # real tokens trained on, all ranks; restored from the checkpoint
        # A mixture's real tokens per component, all ranks (train/tokens/<name>); checkpointed.
        self.component_names = list(mixture_components or [])
        self.component_tokens = [0] * len(self.component_names)
        self.eval_context = [int(k) for k in eval_context]  # scored at the last validation
        self.peak_tflops = peak_tflops
        self._peak_flops: float | None = None  # one device's, known at fit start
        self._last_step_end: float | None = None
        self._batch_ready: float | None = None
        self.last_metrics: dict[str, float] = {}  # latest value of each metric, for the run summary
        self.setup_record: dict | None = None  # what configure_model did (compile stats, ...)

    # --- optimization -------------------------------------------------------------------------
    def configure_optimizers(self):
        settings = self.settings
        decay = [p for p in self.model.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.model.parameters() if p.ndim < 2]
        beta1, beta2 = settings.betas
        optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": settings.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=settings.lr,
            betas=(beta1, beta2),
            **adamw_kernel(self.device),
        )
        schedule = lr_lambda(settings.warmup, settings.max_steps, settings.min_lr_ratio)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return (
            self.trainer.strategy.reduce(tensor, reduce_op="sum") if self.trainer.world_size > 1 else tensor
        )

    def configure_model(self) -> None:
        """Activation checkpointing, compile (train.compile) and sharding, once, before the first step
        (model_setup.py); `self.setup_record` says what was done, for run.json."""
        if self.setup_record is None:  # Lightning may call this again (a second fit, a resume)
            device, mesh = self.trainer.strategy.root_device, self.device_mesh  # mesh: trainer=fsdp's
            self.setup_record = set_up_model(self.model, self.settings, device, mesh)
            fell_back = self.setup_record.get("loss_kernel_fallback")
            if fell_back and self.trainer.is_global_zero:  # auto on CUDA without liger: slower, not wrong
                print(f"note: train.loss_kernel=auto takes the chunked loss: {fell_back}", file=sys.stderr)

    @property
    def compile_stats(self) -> CompileStats | None:
        return None if self.setup_record is None else self.setup_record.get("compile")

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self.compile_stats is not None:  # graphs compiled from here on are recompiles
            self.compile_stats.first_step_done()

    def on_fit_start(self) -> None:
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None
        self._peak_flops = peak_flops(name, self.peak_tflops)

    def training_step(self, update, batch_idx):
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        step_started = time.perf_counter()
        started = self._last_step_end or step_started
        data_seconds = (self._batch_ready or step_started) - started  # waiting for this update
        lr = optimizer.param_groups[0]["lr"]
        result = run_update(
            self.model,
            update.microbatches,
            backward=self.manual_backward,
            all_reduce_sum=self._all_reduce_sum,
            world_size=self.trainer.world_size,
        )
        if self.settings.grad_clip:
            self.clip_gradients(
                optimizer, gradient_clip_val=self.settings.grad_clip, gradient_clip_algorithm="norm"
            )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        self.tokens_seen += result.real_tokens
        if self.component_names:
            self._count_component_tokens(update.microbatches)
        now = time.perf_counter()
        self._last_step_end = now
        # The state after this update is what a checkpoint taken now must resume from.
        datamodule = getattr(self.trainer, "datamodule", None)  # set by fit(); not in Trainer's stubs
        if datamodule is not None:
            datamodule.mark_trained(update.sampler_state)
        step_seconds = now - step_started
        metrics = {
            "train/loss": result.loss,
            "train/tokens": float(self.tokens_seen),
            "train/tokens_per_sec": result.real_tokens / max(now - started, 1e-9),
            "train/padding_waste": 1.0 - result.real_tokens / result.computed_tokens,
            "train/pack_utilization": result.real_tokens / max(result.capacity_slots, 1),
            "train/num_targets": float(result.num_targets),
            "train/step_seconds": step_seconds,
            "train/data_seconds": max(data_seconds, 0.0),
            "train/attention_cost": update_attention_cost(update.microbatches),  # this rank's
            "lr": lr,
            **machine_load(),
        }
        if not result.num_targets:  # a loss mask left this update nothing to train: no loss to log
            del metrics["train/loss"]
        for name, tokens in zip(self.component_names, self.component_tokens, strict=True):
            metrics[f"train/tokens/{name}"] = float(tokens)
        if self._token_budget_reached():
            # train.max_tokens: this update is the last (all ranks agree: tokens_seen is global).
            self.trainer.should_stop = True
        if self._peak_flops:  # this rank's model FLOPs (real segment lengths) over this device's peak
            lengths = [real_segment_lengths(mb) for mb in update.microbatches]
            flops = sum(training_flops(self.gpt_config, segments) for segments in lengths)
            metrics["train/mfu"] = flops / max(now - started, 1e-9) / self._peak_flops
        if self._should_validate():
            metrics.update(self._validation_and_context_metrics())
        self._log_metrics(metrics)
        self.last_metrics.update(metrics)
        return torch.tensor(result.loss)

    def _validation_and_context_metrics(self) -> dict[str, float]:
        """val/* now (none without validation pairs, never nan); context use at the last update."""
        metrics = self.validation_metrics()
        if "val/loss" in metrics and self._is_last_update():
            metrics.update(self.context_use_metrics(metrics["val/loss"]))
        self._last_step_end = time.perf_counter()  # validation time is not training throughput
        return metrics

    def _count_component_tokens(self, microbatches: list[PackedBatch]) -> None:
        """Add this update's real tokens per mixture component (every rank's: one small all-reduce)."""
        mine = np.sum([mb.meta["component_tokens"] for mb in microbatches], axis=0, dtype=np.int64)
        counts = self._all_reduce_sum(torch.as_tensor(mine, dtype=torch.float64, device=self.device))
        totals = counts.cpu().numpy().round().astype(np.int64)
        self.component_tokens = [int(a + b) for a, b in zip(self.component_tokens, totals, strict=True)]

    def _log_metrics(self, metrics: dict) -> None:
        """Straight to the loggers, keyed by optimizer steps done. (self.log would keep re-emitting
        the last val/loss on every later step, and its step counter is not ours.)"""
        step = int(self.trainer.global_step)
        every = self.settings.log_every_n_steps
        if "val/loss" in metrics or step % every == 0 or step == 1:
            for logger in self.loggers:
                logger.log_metrics(metrics, step=step)
        self.log("loss", metrics["train/loss"], prog_bar=True, logger=False, batch_size=1)
        self.log("tok/s", metrics["train/tokens_per_sec"], prog_bar=True, logger=False, batch_size=1)
        if "val/loss" in metrics:
            self.log("val", metrics["val/loss"], prog_bar=True, logger=False, batch_size=1)

    def on_train_batch_start(self, batch, batch_idx):
        self._batch_ready = time.perf_counter()  # the update is fetched and on the device
        if self._last_step_end is None:
            self._last_step_end = self._batch_ready

    # --- validation: token-weighted over the fixed validation batches of all ranks ------------
    # Run from training_step on the optimizer-step count, not by Lightning's batch counter, which
    # restarts on resume: a resumed run validates at exactly the steps an uninterrupted one does.
    def _should_validate(self) -> bool:
        step, every = self.trainer.global_step, self.settings.val_every
        return step % every == 0 or step >= self.settings.max_steps or self._token_budget_reached()

    def _is_last_update(self) -> bool:
        return self.trainer.global_step >= self.settings.max_steps or self._token_budget_reached()

    def _token_budget_reached(self) -> bool:
        budget = self.settings.max_tokens
        return budget is not None and self.tokens_seen >= budget

    @torch.no_grad()
    def validation_sums_by_set(self) -> dict[str | None, ScoreSums] | None:
        """The validation sums of all ranks per validation set (the run's one source, named None, or
        each mixture component), split by the pairs' positions in their documents; None without
        validation pairs. One all-reduce for all sets."""
        datamodule = getattr(self.trainer, "datamodule", None)  # set by fit(); not in Trainer's stubs
        assert datamodule is not None, "validation needs the PretrainDataModule"
        if not datamodule.has_validation:
            return None
        progress = ScoringProgress("validation") if self.trainer.is_global_zero else None
        policy, sets = datamodule.policy, datamodule.validation_sets
        stacked = [
            score_batches(
                self.model, v.batches(policy), self.device, progress, positions=v.positions(policy)
            ).stacked()
            for v in sets
        ]
        reduced = self._all_reduce_sum(torch.stack(stacked)) if len(stacked) > 1 else None
        if reduced is None:
            reduced = self._all_reduce_sum(stacked[0])[None]
        return {v.name: ScoreSums.from_stacked(row) for v, row in zip(sets, reduced, strict=True)}

    def validation_sums(self) -> ScoreSums | None:
        """The validation sums of all ranks over every validation pair (None without one)."""
        by_set = self.validation_sums_by_set()
        if by_set is None:
            return None
        return ScoreSums.from_stacked(torch.stack([s.stacked() for s in by_set.values()]).sum(dim=0))

    def validation_loss(self) -> float | None:
        """Mean loss over the validation pairs of all ranks (None without one)."""
        sums = self.validation_sums()
        return sums.loss if sums is not None else None

    def validation_metrics(self) -> dict[str, float]:
        """`val/loss` and, per position bucket holding a target, `val/loss_by_position/<bucket>` and
        `val/targets_by_position/<bucket>` (their count-weighted mean is val/loss); with a mixture,
        `val/loss/<name>` of each component's validation pairs (val/loss is over all of them)."""
        by_set = self.validation_sums_by_set()
        if by_set is None:
            return {}
        if len(by_set) == 1:
            sums = next(iter(by_set.values()))
        else:
            sums = ScoreSums.from_stacked(torch.stack([s.stacked() for s in by_set.values()]).sum(dim=0))
        if sums.loss is None:
            return {}
        metrics = {"val/loss": sums.loss}
        for name, component in by_set.items():
            if name is not None and component.loss is not None:
                metrics[f"val/loss/{name}"] = component.loss
        counts = sums.count_by_position()
        for bucket, loss in sums.loss_by_position().items():
            metrics[f"val/loss_by_position/{bucket}"] = loss
            metrics[f"val/targets_by_position/{bucket}"] = float(counts[bucket])
        return metrics

    @torch.no_grad()
    def context_use_metrics(self, full: float) -> dict[str, float]:
        """`val/loss_by_context/<k>` for each k of eval.context below data.max_seq_len, and
        `val/context_gain` (training/context_use.py): the same validation pairs of all ranks, each
        predicted from at most k tokens of its own document. `full` is this validation's val/loss."""
        datamodule = getattr(self.trainer, "datamodule", None)
        assert datamodule is not None and datamodule.validation_sets is not None, "setup() first"
        lengths = context_lengths(self.eval_context, datamodule.policy.max_seq_len)
        if not lengths:
            return {}
        progress = ScoringProgress("context use") if self.trainer.is_global_zero else None
        sets = [(v.split, v.chunks) for v in datamodule.validation_sets]
        tokens = datamodule.policy.eval_microbatch_tokens
        sums = [context_sums(self.model, sets, k, tokens, self.device, progress).stacked() for k in lengths]
        reduced = self._all_reduce_sum(torch.stack(sums))
        losses = {k: ScoreSums.from_stacked(row).loss for k, row in zip(lengths, reduced, strict=True)}
        return context_metrics({k: v for k, v in losses.items() if v is not None}, full, prefix="val/")

    # --- counters that a resume must continue -----------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["pretrain"] = {
            "tokens_seen": self.tokens_seen,
            "val_loss": self.last_metrics.get("val/loss"),
        }
        if self.component_names:
            checkpoint["pretrain"]["component_tokens"] = dict(
                zip(self.component_names, self.component_tokens, strict=True)
            )

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        saved = checkpoint.get("pretrain", {})
        self.tokens_seen = int(saved.get("tokens_seen", 0))
        by_name = saved.get("component_tokens", {})
        self.component_tokens = [int(by_name.get(name, 0)) for name in self.component_names]
