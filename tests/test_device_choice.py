"""trainer=auto (the default) and attn=auto resolved for the machine, with CUDA faked where the choice is
made (torch.cuda.is_available / get_device_capability / get_device_name): the GPU with bf16 autocast and
varlen when there is an Ampere-or-later one, the CPU in fp32 with sdpa otherwise; one line says what was
chosen; explicit choices that cannot run here are one-line refusals that say what to change."""

from __future__ import annotations

import pytest
import torch

from pretrain.config import load_config, to_config
from pretrain.errors import ConfigError
from pretrain.training.checks import (
    attention_backend,
    compute_dtype,
    device_line,
    resolve_trainer,
)


def _config(*overrides: str):
    return to_config(load_config(list(overrides)))


@pytest.fixture
def gpu(monkeypatch):
    """A fake CUDA machine: one GPU of the capability the test sets (default: an H100, sm 9.0)."""
    state = {"capability": (9, 0)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: state["capability"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    return state


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_the_default_trainer_is_auto():
    trainer = _config().trainer
    assert (trainer.accelerator, trainer.precision, trainer.devices) == ("auto", "auto", 1)


def test_auto_on_a_gpu_box_trains_on_the_gpu_in_bf16_with_varlen(gpu):
    config = _config()
    resolved = resolve_trainer(config.trainer)
    assert (resolved.accelerator, resolved.precision) == ("gpu", "bf16-mixed")
    assert compute_dtype(resolved) == torch.bfloat16  # what varlen needs
    assert attention_backend(config.attn, config.trainer) == "varlen"
    assert device_line(config.attn, config.trainer, "varlen") == (
        "device: GPU NVIDIA H100 80GB HBM3 (devices=1) (auto), precision bf16-mixed (auto), "
        "attention varlen (auto)"
    )


def test_the_headline_command_is_accepted_on_a_gpu_box(gpu):
    config = _config("data=bestfit", "attn=varlen")
    assert attention_backend(config.attn, config.trainer) == "varlen"
    assert device_line(config.attn, config.trainer, "varlen").endswith(
        "precision bf16-mixed (auto), attention varlen"
    )


def test_a_pre_ampere_gpu_gets_fp16_and_sdpa_under_auto(gpu):
    gpu["capability"] = (7, 5)  # a T4: no flash varlen kernel, no fast bf16
    config = _config()
    assert resolve_trainer(config.trainer).precision == "16-mixed"
    assert attention_backend(config.attn, config.trainer) == "sdpa"


def test_auto_on_a_cpu_box_trains_on_the_cpu_in_fp32_with_sdpa(no_gpu):
    config = _config()
    resolved = resolve_trainer(config.trainer)
    assert (resolved.accelerator, resolved.precision) == ("cpu", "32-true")
    assert attention_backend(config.attn, config.trainer) == "sdpa"
    assert device_line(config.attn, config.trainer, "sdpa") == (
        "device: CPU (auto), precision 32-true (auto), attention sdpa (auto)"
    )


def test_explicit_values_are_kept(gpu):
    resolved = resolve_trainer(_config("trainer=cpu").trainer)
    assert (resolved.accelerator, resolved.precision) == ("cpu", "32-true")
    resolved = resolve_trainer(_config("trainer.precision=16-mixed").trainer)
    assert (resolved.accelerator, resolved.precision) == ("gpu", "16-mixed")


def test_varlen_without_cuda_says_it_needs_a_cuda_gpu(no_gpu):
    config = _config("attn=varlen")
    with pytest.raises(ConfigError) as error:
        attention_backend(config.attn, config.trainer)
    message = str(error.value)
    assert message.startswith("attn=varlen needs a CUDA GPU") and "attn=sdpa" not in message.split(":")[0]
    assert "\n" not in message


def test_varlen_with_trainer_cpu_on_a_gpu_box_points_at_the_gpu(gpu):
    config = _config("attn=varlen", "trainer=cpu")
    with pytest.raises(ConfigError, match=r"trainer.accelerator=cpu trains on the CPU: use trainer=auto"):
        attention_backend(config.attn, config.trainer)


def test_trainer_gpu_without_cuda_is_refused(no_gpu):
    with pytest.raises(ConfigError, match="no CUDA device; use trainer=auto"):
        resolve_trainer(_config("trainer=gpu").trainer)


def test_wandb_tags_the_resolved_backend(tmp_path, monkeypatch, gpu):
    from pretrain.training.loggers import TokenAxisWandbLogger, build_loggers

    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name))
    monkeypatch.setenv("WANDB_MODE", "offline")
    config = _config("logger=wandb", f"output_dir={tmp_path / 'run'}")
    (logger,) = [lg for lg in build_loggers(config, tmp_path / "run") if isinstance(lg, TokenAxisWandbLogger)]
    tags = logger._wandb_init["tags"]
    assert "attn:varlen" in tags and "attn:auto" not in tags


def test_run_settings_hold_the_concrete_trainer_and_say_the_choice(no_gpu, tmp_path):
    from pretrain.training.startup import RunSettings

    run = RunSettings.from_config(load_config(["experiment=smoke", "trainer=auto", f"output_dir={tmp_path}"]))
    assert (run.config.trainer.accelerator, run.config.trainer.precision) == ("cpu", "32-true")
    assert run.attn_backend == "sdpa"
    assert run.device_line == "device: CPU (auto), precision 32-true (auto), attention sdpa (auto)"


# The choice feeds the varlen call path: in a child (fake CUDA can abort a process), the default
# config resolved on a faked H100 gives a backend and a dtype whose forward runs through
# prepare_attention -> attention on fake cuda:0 tensors (FakeTensorMode, forward only).
FORWARD_CHILD = r"""
import json
import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

real = torch.cuda.is_available, torch.cuda.get_device_capability
torch.cuda.is_available = lambda: True
torch.cuda.get_device_capability = lambda device=None: (9, 0)
from pretrain.config import load_config, to_config
from pretrain.model.attention import attention, prepare_attention
from pretrain.training.checks import attention_backend, compute_dtype, resolve_trainer

config = to_config(load_config([]))
backend = attention_backend(config.attn, config.trainer)
dtype = compute_dtype(resolve_trainer(config.trainer))
torch.cuda.is_available, torch.cuda.get_device_capability = real  # fake mode must not think CUDA is real
lengths = np.array([5, 17, 1, 9])
cuda0 = torch.device("cuda", 0)
with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32, device=cuda0)
    q, k, v = (torch.empty(int(lengths.sum()), 2, 16, dtype=dtype, device=cuda0) for _ in range(3))
    meta = prepare_attention(backend, cu, lengths, cuda0)
    out = attention(q, k, v, meta)
    print(json.dumps({"backend": backend, "shape": list(out.shape), "dtype": str(out.dtype),
                      "device": out.device.type}))
"""


def test_the_auto_choice_runs_the_varlen_forward_on_fake_cuda():
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo / "src")}
    proc = subprocess.run(
        [sys.executable, "-c", FORWARD_CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"backend": "varlen", "shape": [32, 2, 16], "dtype": "torch.bfloat16", "device": "cuda"}
