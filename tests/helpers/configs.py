"""Composing configs, running `pretrain prepare`, the tiny-run overrides, module-shared cache roots, and
in-memory splits and policy settings for sampler tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .env import EOS, OFFLINE_ENV, REPO


def base_overrides() -> list[str]:
    """Overrides every composition needs: drop the model/attn groups until their files exist."""
    extra = []
    if not (REPO / "conf" / "model" / "tiny.yaml").is_file():
        extra.append("~model")
    if not (REPO / "conf" / "attn" / "auto.yaml").is_file():
        extra.append("~attn")
    return extra


def compose(*overrides: str):
    from pretrain.config import load_config

    return load_config([*base_overrides(), *overrides])


def cache_spec(cfg):
    """The CacheSpec a run's entry builds from a composed config."""
    from pretrain.config import to_config
    from pretrain.data.ingest.cache import CacheSpec

    return CacheSpec.from_config(to_config(cfg))


def prepare(cfg, **kwargs):
    """`prepare_cache` of a composed config, as `pretrain prepare` runs it."""
    from pretrain.data.ingest.prepare import prepare_cache

    return prepare_cache(cache_spec(cfg), **kwargs)


def files_override(files) -> str:
    return "source.files=[" + ",".join(f"'{Path(f)}'" for f in files) + "]"


def local_overrides(files, **settings) -> list[str]:
    """source=local on `files`, plus `key=value` for each setting (dotted keys via **{"a.b": 1})."""
    return ["source=local", files_override(files), *(f"{k}={_hydra_value(v)}" for k, v in settings.items())]


def _hydra_value(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


SHARED_CACHE = "shared-cache"
"""The session folder of the caches that tests only read (the embedded corpus under a few budgets): built
once per session, whichever module asks first (builds take the cache's lock), reused by every other."""


def module_cache_root(shared: str | None = None):
    """A module-scoped `cache_root` fixture: one cache root (env PRETRAIN_CACHE_ROOT) shared by the
    module's tests, for modules whose tests reuse one built cache. Use: `cache_root = module_cache_root()`;
    modules that pass the same `shared` name share one folder of the session (builds take its lock)."""

    @pytest.fixture(scope="module")
    def cache_root(tmp_path_factory) -> Iterator[Path]:
        root = tmp_path_factory.getbasetemp() / shared if shared else tmp_path_factory.mktemp("cache")
        os.environ["PRETRAIN_CACHE_ROOT"] = str(root)
        yield root
        os.environ.pop("PRETRAIN_CACHE_ROOT", None)

    return cache_root


# The smallest run that still trains: one block of width 32, 2 packs of 32 tokens.


TINY_RUN = [
    "experiment=smoke",
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "data.max_seq_len=32",
    "train.batch_size=2",
    "train.val_batches=1",
    "logger=csv",
]


def cli_env(cache_root: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(OFFLINE_ENV)
    env.update(
        {"PRETRAIN_CACHE_ROOT": str(cache_root), "TOKENIZERS_PARALLELISM": "true", "PYTHONUNBUFFERED": "1"}
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


def prepare_command(*overrides: str) -> list[str]:
    """`pretrain prepare` through the installed console script (or the module when there is none)."""
    script = Path(sys.executable).parent / "pretrain"
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "pretrain.cli"]
    return [*command, "prepare", *base_overrides(), *overrides]


def run_prepare(
    cache_root: Path, *overrides: str, timeout: float = 120, **env
) -> subprocess.CompletedProcess:
    return subprocess.run(
        prepare_command(*overrides),
        cwd=REPO,
        env=cli_env(cache_root, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def policy_cfg(policy: str, *overrides: str):
    """PolicySettings as a run builds them for data=<policy> plus dotlist overrides, through the
    typed schema (no source or tokenizer needed: for sampler tests on in-memory splits)."""
    from omegaconf import OmegaConf

    from pretrain.config import Config
    from pretrain.data.batching.policies import PolicySettings, policy_class

    chosen = OmegaConf.from_dotlist([f"data.policy={policy}", *overrides])
    schema = policy_class(chosen.data.policy).config_class  # the group typed as data=<policy> types it
    root = OmegaConf.merge(OmegaConf.structured(Config), {"data": OmegaConf.structured(schema)}, chosen)
    data, train = OmegaConf.to_object(root.data), OmegaConf.to_object(root.train)
    return PolicySettings.from_config(data, train, root.seed)


def settings_of(cfg):
    """PolicySettings of a composed config, as the run's entry builds them."""
    from pretrain.config import to_config
    from pretrain.data.batching.policies import PolicySettings

    config = to_config(cfg)
    return PolicySettings.from_config(config.data, config.train, config.seed)


def split_of(documents, name: str = "train", eos: bool = True):
    """An in-memory TokenSplit of token lists; appends EOS to each document unless `eos=False`."""
    import numpy as np

    from pretrain.arrays import prefix_sums
    from pretrain.data.tokens import TokenSplit

    docs = [list(d) + ([EOS] if eos else []) for d in documents]
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    tokens = np.array([t for d in docs for t in d], dtype=np.uint32)
    return TokenSplit(tokens=tokens, offsets=prefix_sums(lengths)[:-1], lengths=lengths, name=name)
