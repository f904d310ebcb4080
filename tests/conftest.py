"""Fixtures only (the helpers live in tests/helpers/): an offline environment for every test, a private
or module-shared cache root, the fixture corpus and its files, and a config factory on them."""

from __future__ import annotations

import inspect
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

# Importing any helper first sets the offline environment (helpers/env.py), before the hub libraries load.
from helpers.configs import compose, local_overrides
from helpers.env import _SESSION_CACHE_ROOT, OFFLINE_ENV
from helpers.slurm import Jobs, skip_or_fail, slurm_unavailable
from helpers.sources import write_jsonl, write_parquet
from helpers.texts import fixture_texts

# A suite started in the background (`nohup make test &`, `(cmd &)` in a script) inherits SIGINT ignored,
# and so would every process it starts: the Ctrl-C and preemption tests need Python's default handler.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """Every test: no network, and a private cache root (unless its module chose a shared one)."""
    for key, value in OFFLINE_ENV.items():
        monkeypatch.setenv(key, value)
    current = os.environ.get("PRETRAIN_CACHE_ROOT")
    if current not in (None, _SESSION_CACHE_ROOT):
        return Path(current)
    root = tmp_path / "cache-root"
    monkeypatch.setenv("PRETRAIN_CACHE_ROOT", str(root))
    return root


@pytest.fixture
def cache_root(offline) -> Path:
    return offline


@pytest.fixture(scope="session")
def corpus_texts() -> list[str]:
    return fixture_texts()


@pytest.fixture
def parquet_file(tmp_path, corpus_texts) -> Path:
    return write_parquet(tmp_path / "data" / "corpus.parquet", corpus_texts, row_group_size=40)


@pytest.fixture
def jsonl_file(tmp_path, corpus_texts) -> Path:
    return write_jsonl(tmp_path / "data" / "corpus.jsonl", corpus_texts)


@pytest.fixture
def make_cfg(tmp_path, corpus_texts):
    """make_cfg(files=None, **{"budget.train_tokens": 1000}) -> the composed config, source=local.

    Without `files`, the fixture corpus is written as parquet under tmp_path.
    """

    def make(files=None, *overrides: str, **settings):
        if files is None:
            path = tmp_path / "data" / "corpus.parquet"
            if not path.exists():
                write_parquet(path, corpus_texts, row_group_size=40)
            files = [path]
        return compose(*local_overrides(files, **settings), *overrides)

    return make


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """A Slurm that runs jobs (scripts/slurm_local.sh start): skipped with the reason without one,
    failed instead under PRETRAIN_REQUIRE_SLURM=1 (CI). Tests using it are marked `slurm`."""
    reason = slurm_unavailable()
    if reason is not None:
        skip_or_fail(reason)


@pytest.fixture
def slurm_jobs(slurm_cluster) -> Iterator[Jobs]:
    """sbatch for a test; its jobs still queued or running when it ends are cancelled."""
    jobs = Jobs()
    yield jobs
    jobs.cancel_all()


# --- tiers: `make test` (unit), `make test-e2e`, `make test-all` ----------------------------------

# What makes a test end-to-end: it trains, starts processes or builds the embedded corpus's cache, itself
# or through a fixture. Such calls in the test's (or a fixture's) source mark it `e2e`, so a new test is
# tiered by what it does, not by a list someone must keep.
_E2E_CALLS = re.compile(
    r"\btrain\(|\bsubprocess\.|\brun_prepare\(|\bmp\.spawn\(|\bPopen\(|\bprepare_cache\(|\bmain\(\[|"
    r"\bcheck_call\(|\bspawn\("
)


def _source(function) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


_CALLED = re.compile(r"\b([A-Za-z_]\w*)\(")


def _calls_e2e(function, module, depth: int = 2) -> bool:
    """Whether `function` makes an end-to-end call, itself or through the test module's own helpers
    (`depth` levels down: `_run(...)` that calls `train(...)` counts)."""
    source = _source(function)
    if _E2E_CALLS.search(source):
        return True
    if depth == 0:
        return False
    for name in set(_CALLED.findall(source)):
        helper = getattr(module, name, None)
        if inspect.isfunction(helper) and helper.__module__ == module.__name__ and helper is not function:
            if _calls_e2e(helper, module, depth - 1):
                return True
    return False


def _is_e2e(item) -> bool:
    if _calls_e2e(getattr(item, "function", None), item.module):
        return True
    fixtures = getattr(item, "_fixtureinfo", None)
    for name, definitions in fixtures.name2fixturedefs.items() if fixtures else ():
        if name == "cache_root" and getattr(item.module, "cache_root", None) is not None:
            return (
                True  # a module-shared cache of the embedded corpus: the module's tests build or train on it
            )
        if any(
            _E2E_CALLS.search(_source(d.func)) for d in definitions if d.baseid
        ):  # the suite's own fixtures
            return True
    return False


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):  # jobs on Slurm: end-to-end too
            item.add_marker(pytest.mark.slurm)
            item.add_marker(pytest.mark.e2e)
        if (
            item.get_closest_marker("e2e") is None
            and item.get_closest_marker("slow") is None
            and _is_e2e(item)
        ):
            item.add_marker(pytest.mark.e2e)
