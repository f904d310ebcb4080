"""`pretrain prepare` as users run it: a subprocess, its stdout, its exit code, kills and races."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import (
    REPO,
    cli_env,
    compose,
    english_text,
    expected_cache,
    files_override,
    prepare,
    prepare_command,
    run_prepare,
    write_parquet,
)

from pretrain.data.ingest.cache import CacheError
from pretrain.data.ingest.verify import verify_cache


def last_line(stdout: str) -> str:
    return stdout.rstrip("\n").splitlines()[-1]


def cache_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def hidden_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith("."))


N_BIG = 1600


@pytest.fixture(scope="module")
def big_parquet(tmp_path_factory) -> Path:
    """~4.5M characters (~1M GPT-2 tokens) of distinct documents: a build of several tokenizer batches."""
    rng = random.Random(3)
    paragraphs = [english_text(random.Random(i), 1) for i in range(300)]
    texts = [
        f"Record {i}. " + "\n\n".join(rng.choice(paragraphs) for _ in range(rng.randint(4, 10)))
        for i in range(N_BIG)
    ]
    return write_parquet(tmp_path_factory.mktemp("big") / "big.parquet", texts, row_group_size=200)


def test_prepare_prints_the_verified_cache_dir(parquet_file, cache_root, corpus_texts, tmp_path):
    overrides = ["source=local", files_override([parquet_file]), "split.validation_fraction=0.2"]
    # PRETRAIN_CACHE_ROOT wins over the config's cache_root.
    result = run_prepare(cache_root, *overrides, f"cache_root={tmp_path / 'ignored'}")
    assert result.returncode == 0, result.stderr
    directory = Path(last_line(result.stdout))
    assert directory.is_absolute() and directory.parent == cache_root.resolve()
    assert not (tmp_path / "ignored").exists()
    manifest = verify_cache(directory)
    expected = expected_cache(corpus_texts, fraction=0.2)
    for split in ("train", "validation"):
        assert manifest["splits"][split]["documents"] == len(expected[split]["docs"])
        assert manifest["splits"][split]["tokens"] == sum(map(len, expected[split]["docs"]))
        assert f"{manifest['splits'][split]['tokens']:,}" in result.stdout  # the table shows the counts

    again = run_prepare(cache_root, *overrides, "data.max_seq_len=64")
    assert again.returncode == 0, again.stderr
    assert last_line(again.stdout) == str(directory)
    assert json.loads((directory / "manifest.json").read_text()) == manifest  # reused, not rebuilt
    assert cache_dirs(cache_root) == [directory]


def test_corrupt_cache_exits_2_and_rebuild_repairs(parquet_file, cache_root):
    overrides = ["source=local", files_override([parquet_file])]
    directory = prepare(compose(*overrides), progress=False).directory  # built in-process: quicker
    data = bytearray((directory / "train.bin").read_bytes())
    data[len(data) // 3] ^= 0xFF
    (directory / "train.bin").write_bytes(bytes(data))

    broken = run_prepare(cache_root, *overrides)
    assert broken.returncode == 2
    assert broken.stderr.startswith("error:") and "Traceback" not in broken.stderr
    assert "train.bin" in broken.stderr and "cache.rebuild=true" in broken.stderr
    assert str(directory) not in broken.stdout

    fixed = run_prepare(cache_root, *overrides, "cache.rebuild=true")
    assert fixed.returncode == 0, fixed.stderr
    assert last_line(fixed.stdout) == str(directory)
    verify_cache(directory)
    assert hidden_dirs(cache_root) == []


def _kill_when(process: subprocess.Popen, root: Path, moment: str, timeout: float = 90) -> None:
    """SIGKILL `process` once its temporary build directory reaches `moment`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the build finished before it could be killed: make the corpus bigger"
        for tmp in root.glob(".*.tmp-*"):
            train_bin = tmp / "train.bin"
            if moment == "started" or (train_bin.is_file() and train_bin.stat().st_size > 0):
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=30)
                return
        time.sleep(0.002)
    process.kill()
    pytest.fail(f"no temporary build directory reached {moment!r} in {timeout} s")


@pytest.mark.parametrize("moment", ["mid-write", pytest.param("started", marks=pytest.mark.slow)])
def test_sigkill_mid_build_then_rerun(big_parquet, cache_root, moment):
    overrides = ["source=local", files_override([big_parquet])]
    process = subprocess.Popen(
        prepare_command(*overrides),
        cwd=REPO,
        env=cli_env(cache_root),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    cache_root.mkdir(parents=True, exist_ok=True)
    _kill_when(process, cache_root, moment)
    assert process.returncode == -signal.SIGKILL

    # Nothing the kill left behind passes verification, and there is no cache under its name.
    assert cache_dirs(cache_root) == []
    leftovers = [cache_root / name for name in hidden_dirs(cache_root)]
    assert leftovers and all(".tmp-" in p.name for p in leftovers)
    for path in leftovers:
        with pytest.raises(CacheError):
            verify_cache(path)

    rerun = run_prepare(cache_root, *overrides)
    assert rerun.returncode == 0, rerun.stderr
    directory = Path(last_line(rerun.stdout))
    manifest = verify_cache(directory)
    assert manifest["build"]["documents_read"] == N_BIG  # complete: no budget, the whole source
    assert hidden_dirs(cache_root) == []
    assert cache_dirs(cache_root) == [directory]


def test_two_concurrent_prepares_build_once(big_parquet, cache_root):
    overrides = ["source=local", files_override([big_parquet]), "budget.validation_tokens=50000"]
    processes = [
        subprocess.Popen(
            prepare_command(*overrides),
            cwd=REPO,
            env=cli_env(cache_root),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=180) for p in processes]
    for process, (_, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err
    directories = {last_line(out) for out, _ in outputs}
    assert len(directories) == 1
    directory = Path(directories.pop())
    manifest = verify_cache(directory)
    assert cache_dirs(cache_root) == [directory]
    assert hidden_dirs(cache_root) == []
    # Both report the same cache (the table is computed from each process's own manifest).
    assert outputs[0][0] == outputs[1][0]
    assert f"{manifest['splits']['train']['tokens']:,}" in outputs[0][0]
    # Exactly one built (its progress line reports the rate); the other waited on the lock and reused.
    assert sum("tok/s" in err for _, err in outputs) == 1, [err for _, err in outputs]


def test_fineweb_offline_fails_fast_and_names_the_alternatives(cache_root):
    # "Fast": no retry loop against the unreachable hub; the subprocess timeout bounds it, not a clock.
    result = run_prepare(
        cache_root, "source=fineweb", "budget.train_tokens=1000", "budget.validation_tokens=100", timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error:")
    assert "source=local" in result.stderr and "source=pydocs" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout.strip() == "" or not Path(last_line(result.stdout)).exists()
    if cache_root.exists():
        assert cache_dirs(cache_root) == [] and hidden_dirs(cache_root) == []


BAD = {
    "unknown source": (["source=nonexistent"], "source=nonexistent: no such option; choose one of"),
    "unknown key": (["notakey=1"], "notakey"),
    "unparsable override": (["source=["], "source=["),
    "budget not a number": (["budget.train_tokens=abc"], "budget.train_tokens"),
    "local without files": (["source=local"], "source.files"),
}


def test_bad_overrides_exit_2_with_a_readable_message(cache_root):
    """All the bad command lines at once (each is a fresh process)."""
    env = cli_env(cache_root)
    running = {
        name: subprocess.Popen(
            prepare_command(*overrides),
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (overrides, _) in BAD.items()
    }
    for name, process in running.items():
        out, err = process.communicate(timeout=120)
        expected = BAD[name][1]
        assert process.returncode == 2, (name, err)
        assert err.startswith("error:"), (name, err)
        assert "Traceback" not in err, (name, err)
        assert expected in err or (name == "unparsable override" and "[" in err), (name, err)
        assert out == "", (name, out)
