"""Faults of `pretrain prepare` (issue 17): each is one `error:` line with exit status 2 (or the cap's one
line), and what is left on disk is what a rerun needs and nothing that verifies; plus the prepare
settings reaching every build (issue 16: no context variable)."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import multiprocessing
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from filelock import FileLock
from helpers import (
    REPO,
    TINY_RUN,
    base_overrides,
    cache_spec,
    cli_env,
    compose,
    english_text,
    fixture_texts,
    local_overrides,
    prepare_command,
    write_jsonl,
    write_parquet,
)

from pretrain.cli import main
from pretrain.data.ingest import collect
from pretrain.data.ingest.prepare import prepare_cache
from pretrain.data.ingest.prepare_settings import PrepareSettings, usable_cores
from pretrain.data.ingest.staging import checksum_file, part_file, staging_dir
from pretrain.data.ingest.verify import verify_cache
from pretrain.data.ingest.writer import SplitWriter
from pretrain.data.sources import PartSizes


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """`pretrain ...` in this process: (exit status, stdout, stderr)."""
    try:
        code = main([args[0], *base_overrides(), *args[1:]])
    except SystemExit as exit:
        code = int(exit.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def left_on_disk(root: Path) -> list[str]:
    """Everything under the cache root but the build locks."""
    return sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock"))


def assert_lock_free(root: Path, key: str) -> None:
    lock = FileLock(str(root / f"{key}.lock"))
    lock.acquire(timeout=0)  # raises Timeout if a process still held it
    lock.release()


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return fixture_texts()


# --- multi-task part files carry their sha256 ---------------------------------------------------


def test_a_damaged_part_file_names_its_task_and_nothing_is_assembled(tmp_path, texts, cache_root, capsys):
    path = write_jsonl(tmp_path / "corpus.jsonl", texts)
    overrides = [*local_overrides([path]), "prepare.num_proc=1"]
    for task in (0, 1):
        code, out, err = run_cli(capsys, "prepare", "prepare.tasks=2", f"prepare.task={task}", *overrides)
        assert code == 0, err
    spec = cache_spec(compose(*overrides, "prepare.tasks=2"))
    damaged = part_file(spec, 2, 1)
    assert checksum_file(damaged).read_text().split() == [
        hashlib.sha256(damaged.read_bytes()).hexdigest(),
        damaged.name,
    ]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, in a token: the format alone would not notice
    damaged.write_bytes(bytes(data))

    code, out, err = run_cli(capsys, "prepare", "prepare.tasks=2", *overrides)
    assert code == 2 and "Traceback" not in err
    (line,) = error_lines(err)
    assert f"the part file of task 1 ({damaged}) is damaged" in line
    assert "pretrain prepare prepare.tasks=2 prepare.task=1" in line
    # Nothing half-assembled; the intact part file stays for the rerun.
    assert left_on_disk(cache_root) == [staging_dir(spec, 2).name]
    assert sorted(p.name for p in staging_dir(spec, 2).iterdir()) == sorted(
        [part_file(spec, 2, 0).name, checksum_file(part_file(spec, 2, 0)).name, damaged.name]
        + [checksum_file(damaged).name]
    )
    assert_lock_free(cache_root, spec.key)

    # A part file without its sha256 (its task was killed before it finished) is refused the same way.
    checksum_file(part_file(spec, 2, 0)).unlink()
    code, out, err = run_cli(capsys, "prepare", "prepare.tasks=2", *overrides)
    assert code == 2
    (line,) = error_lines(err)
    assert "task 0" in line and "did not finish" in line and "prepare.tasks=2 prepare.task=0" in line

    # Rerunning the named tasks, then the assembly, gives the verified cache and removes the staging.
    for task in (1, 0):
        assert run_cli(capsys, "prepare", "prepare.tasks=2", f"prepare.task={task}", *overrides)[0] == 0
    code, out, err = run_cli(capsys, "prepare", "prepare.tasks=2", *overrides)
    assert code == 0, err
    assert Path(out.splitlines()[-1]) == spec.directory
    verify_cache(spec.directory, spec.identity)
    assert left_on_disk(cache_root) == [spec.key]


# --- a source without usable document -----------------------------------------------------------


def test_a_source_of_blank_documents_fails_naming_it(tmp_path, cache_root, capsys):
    blank = write_jsonl(tmp_path / "blank.jsonl", ["", "   ", "\n\t\n"])
    code, out, err = run_cli(capsys, "prepare", *local_overrides([blank]))
    assert code == 2 and "Traceback" not in err
    assert error_lines(err) == [
        "error: source=local (blank.jsonl) has no usable document: 3 read, 3 of them empty or blank; "
        "give it rows whose `text` is not blank"
    ]
    assert left_on_disk(cache_root) == []  # no empty cache, no temporary build
    assert_lock_free(cache_root, cache_spec(compose(*local_overrides([blank]))).key)


# --- prepare.num_proc above the usable cores ----------------------------------------------------


def test_num_proc_above_the_usable_cores_is_capped_with_one_line(tmp_path, texts, cache_root, capsys):
    path = write_jsonl(tmp_path / "corpus.jsonl", texts[:30])
    cores = usable_cores()
    code, out, err = run_cli(capsys, "prepare", *local_overrides([path]), "prepare.num_proc=64")
    assert code == 0, err
    notes = [line for line in err.splitlines() if "prepare.num_proc" in line]
    assert notes == [f"prepare.num_proc=64 is above the {cores} usable cores: using {cores}"]
    manifest = verify_cache(Path(out.splitlines()[-1]))
    assert manifest["build"]["num_proc"] == cores


# --- an OSError while the cache is written ------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "hint"),
    [(errno.ENOSPC, "free space there"), (errno.EACCES, "make it writable")],
    ids=["ENOSPC", "EACCES"],
)
def test_an_oserror_of_the_build_is_one_line_and_leaves_nothing(
    tmp_path, texts, cache_root, capsys, monkeypatch, code, hint
):
    path = write_jsonl(tmp_path / "corpus.jsonl", texts[:30])
    failed: list[Path] = []

    def full_disk(self, doc_ids, tokens, lengths, mask=None):
        target = self.directory / f"{self.split}.bin"
        failed.append(target)
        raise OSError(code, os.strerror(code), str(target))

    monkeypatch.setattr(SplitWriter, "write_many", full_disk)
    status, out, err = run_cli(capsys, "prepare", *local_overrides([path]), "prepare.num_proc=1")
    assert status == 2
    assert "Traceback" not in err and "During handling" not in err
    (line,) = error_lines(err)
    assert line.startswith(f"error: building the cache failed writing {failed[0]}: {os.strerror(code)}; ")
    assert "nothing was kept" in line and hint in line and "cache_root" in line
    assert left_on_disk(cache_root) == []  # the temporary build directory is gone
    assert_lock_free(cache_root, cache_spec(compose(*local_overrides([path]))).key)


# --- any exception in the building process ------------------------------------------------------


class Preempted(Exception):
    """What a training run's signal handler raises (training/run.py): any exception will do."""


@pytest.mark.parametrize("error", [Preempted, KeyboardInterrupt])
def test_an_exception_in_the_parents_loop_stops_the_workers_and_leaves_nothing(
    tmp_path, texts, cache_root, monkeypatch, error
):
    path = write_jsonl(tmp_path / "corpus.jsonl", texts + texts[:20])
    spec = dataclasses.replace(
        cache_spec(compose(*local_overrides([path]))),
        prepare=PrepareSettings(num_proc=2, part_sizes=PartSizes(jsonl_bytes=4000)),
    )
    seen: dict[str, list] = {"workers": []}
    original = collect.Collector.add

    def raise_on_second_part(self, part):
        seen["workers"].append(multiprocessing.active_children())
        if len(seen["workers"]) == 2:
            raise error("raised in the building process, as a signal handler would")
        return original(self, part)

    monkeypatch.setattr(collect.Collector, "add", raise_on_second_part)
    with pytest.raises(error, match="raised in the building process"):
        prepare_cache(spec, progress=False)
    workers = [p for p in seen["workers"][-1] if p.name.startswith("pretrain-prepare-")]
    assert len(workers) == 2  # both were running when the exception came
    assert not [p for p in workers if p.is_alive()]  # stopped and reaped, not orphaned
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("pretrain-prepare-")]
    assert left_on_disk(cache_root) == []
    assert_lock_free(cache_root, spec.key)


# --- SIGINT/SIGTERM to the process group reach the parent only ----------------------------------


def _signal_mask(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _bit(number: int) -> int:
    return 1 << (number - 1)


def _workers_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z" and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def big_parquet(tmp_path_factory) -> Path:
    """3,000 distinct documents (~0.7M GPT-2 tokens): a build that lasts a few seconds on 2 workers."""
    rng = random.Random(5)
    paragraphs = [english_text(random.Random(i), 1) for i in range(200)]
    texts = [
        f"Entry {i}. " + "\n\n".join(rng.choice(paragraphs) for _ in range(rng.randint(1, 3)))
        for i in range(3000)
    ]
    return write_parquet(tmp_path_factory.mktemp("big") / "big.parquet", texts)


def test_ctrl_c_to_the_process_group_reaches_the_parent_only(big_parquet, cache_root):
    overrides = ["source=local", f"source.files=['{big_parquet}']", "prepare.num_proc=2"]
    process = subprocess.Popen(
        prepare_command(*overrides),
        cwd=REPO,
        env=cli_env(cache_root),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    both = _bit(signal.SIGINT) | _bit(signal.SIGTERM)
    deadline = time.monotonic() + 60
    workers: list[int] = []
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        workers = _workers_of(process.pid)
        # From their start the workers block both signals, then ignore them (their first instruction).
        if len(workers) == 2 and all(_signal_mask(w, "SigIgn") & both == both for w in workers):
            break
        for worker in workers:
            with_mask = _signal_mask(worker, "SigIgn") | _signal_mask(worker, "SigBlk")
            assert with_mask & both == both, f"worker {worker} could be killed by Ctrl-C"
        time.sleep(0.01)
    else:
        process.kill()
        pytest.fail("the two prepare workers did not start within 60 s")
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1] == "interrupted"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err  # no worker saw the Ctrl-C
    deadline = time.monotonic() + 30  # a poll limit: the parent reaped them before it exited
    while time.monotonic() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.05)
    assert not [w for w in workers if _alive(w)]
    spec = cache_spec(compose(*overrides))
    assert left_on_disk(cache_root) == []
    assert_lock_free(cache_root, spec.key)


# --- the prepare settings reach every build -----------------------------------------------------


def test_prepare_settings_ride_on_the_cache_spec():
    spec = cache_spec(compose("prepare.num_proc=1", "prepare.encoder=tokenizers"))
    assert spec.prepare == PrepareSettings(num_proc=1, encoder="tokenizers")
    assert cache_spec(compose()).prepare == PrepareSettings()
    assert spec.key == cache_spec(compose()).key  # how a cache is built is not what it holds


def test_train_builds_its_cache_with_the_prepare_settings(tmp_path, cache_root):
    """`python train.py ... prepare.num_proc=1 prepare.encoder=tokenizers`, in process: the defaults
    for pydocs would be the usable cores and tiktoken."""
    from pretrain.config import load_config
    from pretrain.training.run import train

    overrides = [
        *base_overrides(),
        *TINY_RUN,
        f"output_dir={tmp_path / 'run'}",
        "progress_bar=false",
        "train.max_steps=1",
        "train.warmup_steps=0",
        "budget.train_tokens=20000",
        "budget.validation_tokens=2000",
        "prepare.num_proc=1",
        "prepare.encoder=tokenizers",
    ]
    summary = train(load_config(overrides))
    manifest = verify_cache(Path(summary["cache_dir"]))
    assert manifest["build"]["num_proc"] == 1
    assert manifest["build"]["encoder"] == "tokenizers"
