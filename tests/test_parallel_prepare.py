"""Parallel and multi-task prepare: the same bytes for any `prepare.num_proc` and for `prepare.tasks`,
budgets that keep their meaning across workers, workers that die with their parent (and a parent that
stops when a worker dies), and source errors that say what to change."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock
from helpers import (
    REPO,
    cache_spec,
    cli_env,
    compose,
    english_text,
    expected_cache,
    fixture_texts,
    local_overrides,
    prepare_command,
    write_jsonl,
    write_parquet,
)

from pretrain.data.ingest import prepare_settings as settings_module
from pretrain.data.ingest.cache import CacheError
from pretrain.data.ingest.prepare import prepare_cache
from pretrain.data.ingest.prepare_settings import PrepareSettings, resolve_num_proc
from pretrain.data.ingest.staging import part_file, prepare_task, staging_dir
from pretrain.data.ingest.verify import verify_cache
from pretrain.data.sources import LocalSource, PartSizes, documents, fineweb, source_from_config
from pretrain.errors import ConfigError, SourceError

FRACTION = 0.2
CACHE_FILES = ("train.bin", "train.jsonl", "validation.bin", "validation.jsonl")


def file_digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file() and not p.name.startswith(".") and p.name != "manifest.json"
    }


def with_settings(cfg, root: Path, **settings):
    """The CacheSpec of `cfg` under `root`, built with these prepare settings."""
    return dataclasses.replace(cache_spec(cfg), root=root, prepare=PrepareSettings(**settings))


def build(cfg, root: Path, **settings):
    """prepare_cache of `cfg` under `root` with these prepare settings (in this process)."""
    return prepare_cache(with_settings(cfg, root, **settings), progress=False)


# Parts of a few documents, so that a small corpus is many parts interleaved over the workers (the
# sizes travel with the source object to the workers).
SMALL_PARTS = PartSizes(parquet_rows=7, jsonl_bytes=6000, pydocs_modules=64)


def local_parts(path: Path, sizes: PartSizes = SMALL_PARTS) -> list:
    return list(LocalSource(files=(str(path),), sizes=sizes).parts())


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return fixture_texts()  # distinct documents, exact duplicates, blank ones, long ones


# --- byte-identical for any num_proc ------------------------------------------------------------


BUDGETS = {"budget.train_tokens": 30_000, "budget.validation_tokens": 4_000}


def test_local_jsonl_with_duplicates_and_budgets_is_the_same_for_1_and_2_workers(tmp_path, texts):
    path = write_jsonl(tmp_path / "corpus.jsonl", texts + texts[:40])  # more duplicates at the end
    assert len(local_parts(path)) > 8
    cfg = compose(*local_overrides([path], **{"split.validation_fraction": FRACTION, **BUDGETS}))
    one = build(cfg, tmp_path / "one", num_proc=1, part_sizes=SMALL_PARTS)
    two = build(cfg, tmp_path / "two", num_proc=2, part_sizes=SMALL_PARTS)
    assert one.directory.name == two.directory.name  # the same identity
    assert file_digests(one.directory) == file_digests(two.directory)
    assert two.manifest["build"]["num_proc"] == 2 and one.manifest["build"]["num_proc"] == 1
    # The budgets stopped the stream mid-way, at the same document as the requirements say.
    expected = expected_cache(
        texts + texts[:40], fraction=FRACTION, train_tokens=30_000, validation_tokens=4_000
    )
    assert expected["stats"]["read"] < len(texts)
    for cache in (one, two):
        b = cache.manifest["build"]
        got = (b["documents_read"], b["duplicates_skipped"], b["empty_skipped"], b["over_budget_skipped"])
        assert got == tuple(expected["stats"][k] for k in ("read", "duplicates", "empty", "over_budget"))
        for split in ("train", "validation"):
            assert cache.manifest["splits"][split]["documents"] == len(expected[split]["docs"])
            assert cache.manifest["splits"][split]["tokens"] == sum(map(len, expected[split]["docs"]))


def test_parquet_parts_across_row_groups_are_the_same_for_1_and_2_workers(tmp_path, texts):
    first = write_parquet(tmp_path / "a.parquet", texts[:70], row_group_size=5)
    second = write_parquet(tmp_path / "b.parquet", texts[60:], row_group_size=40)  # overlapping: duplicates
    cfg = compose(*local_overrides([first, second], **{"split.validation_fraction": FRACTION}))
    one = build(cfg, tmp_path / "one", num_proc=1, part_sizes=SMALL_PARTS)
    two = build(cfg, tmp_path / "two", num_proc=2, part_sizes=SMALL_PARTS)
    assert file_digests(one.directory) == file_digests(two.directory)
    assert one.manifest["splits"] == two.manifest["splits"]
    assert two.manifest["build"]["duplicates_skipped"] >= 10


def test_a_bad_row_read_by_a_worker_is_the_same_one_line_error(tmp_path, texts, cache_root):
    rows = [{"text": t} for t in texts[:40]]
    rows[22]["text"] = None  # in the 4th part (rows 20..25): the second worker's
    path = write_parquet(tmp_path / "nulls.parquet", None, rows=rows)
    assert [(p.start, p.stop) for p in local_parts(path)][3] == (20, 26)
    with pytest.raises(SourceError, match=r"nulls\.parquet: row 22: `text` is NoneType, not a string"):
        build(compose(*local_overrides([path])), cache_root, num_proc=2, part_sizes=SMALL_PARTS)
    assert [p.name for p in cache_root.iterdir() if not p.name.endswith(".lock")] == []


def test_pydocs_with_a_budget_is_the_same_for_1_and_2_workers(tmp_path):
    cfg = compose("budget.train_tokens=120000", "budget.validation_tokens=8000")
    one = build(cfg, tmp_path / "one", num_proc=1, part_sizes=SMALL_PARTS)
    two = build(cfg, tmp_path / "two", num_proc=2, part_sizes=SMALL_PARTS)
    assert file_digests(one.directory) == file_digests(two.directory)
    assert two.manifest["splits"]["train"]["tokens"] >= 120_000
    assert two.manifest["build"]["encoder"] == "tiktoken" and two.manifest["build"]["num_proc"] == 2


def test_num_proc_default_and_bounds(tmp_path, texts, monkeypatch, capsys):
    path = write_jsonl(tmp_path / "small.jsonl", texts[:5])
    local = source_from_config(compose(*local_overrides([path])).source)
    pydocs = source_from_config(compose().source)
    settings = PrepareSettings()
    assert resolve_num_proc(settings, local) == 1  # a small local source: in-process
    cores = len(os.sched_getaffinity(0))
    assert resolve_num_proc(settings, pydocs) == cores
    monkeypatch.setattr(settings_module, "usable_cores", lambda: 4)
    assert resolve_num_proc(PrepareSettings(num_proc=3), local) == 3
    assert capsys.readouterr().err == ""
    # Above the usable cores: capped, with one line saying so.
    assert resolve_num_proc(PrepareSettings(num_proc=64), local) == 4
    assert capsys.readouterr().err == "prepare.num_proc=64 is above the 4 usable cores: using 4\n"
    with pytest.raises(ConfigError, match=r"prepare\.num_proc"):
        compose_typed("prepare.num_proc=0")
    with pytest.raises(ConfigError, match=r"prepare\.task=3 must be in 0\.\.2"):
        compose_typed("prepare.tasks=3", "prepare.task=3")


def compose_typed(*overrides):
    from pretrain.config import to_config

    return to_config(compose(*overrides))


# --- multi-task: parts files, assembled in order ------------------------------------------------


def test_tasks_assemble_the_same_cache(tmp_path, texts):
    path = write_jsonl(tmp_path / "corpus.jsonl", texts + texts[:30])
    cfg = compose(*local_overrides([path], **{"split.validation_fraction": FRACTION, **BUDGETS}))
    single = build(cfg, tmp_path / "single", num_proc=1)

    root = tmp_path / "tasks"
    spec = with_settings(cfg, root, tasks=3, part_sizes=SMALL_PARTS)
    with pytest.raises(CacheError, match=r"no part file of task\(s\) 0, 1, 2 .*prepare\.task=<i>"):
        prepare_cache(spec, progress=False)
    for task in (2, 0, 1):  # any order, any machine
        workers = 2 if task == 1 else 1
        task_spec = with_settings(cfg, root, tasks=3, task=task, num_proc=workers, part_sizes=SMALL_PARTS)
        written = prepare_task(task_spec, progress=False)
        assert written == part_file(spec, 3, task) and written.is_file()
    assembled = prepare_cache(spec, progress=False)
    assert assembled.directory.name == single.directory.name
    assert file_digests(assembled.directory) == file_digests(single.directory)
    assert assembled.manifest["splits"] == single.manifest["splits"]
    verify_cache(assembled.directory, spec.identity)


def test_a_part_file_of_another_cache_is_refused(tmp_path, texts):
    path = write_jsonl(tmp_path / "corpus.jsonl", texts[:20])
    cfg = compose(*local_overrides([path]))
    spec = with_settings(cfg, tmp_path / "root", tasks=2)
    other = with_settings(compose(*local_overrides([path]), "split.seed=7"), spec.root, tasks=2, task=0)
    prepare_task(other, progress=False)
    prepare_task(dataclasses.replace(spec, prepare=PrepareSettings(tasks=2, task=1)), progress=False)
    staging_dir(spec, 2).mkdir(parents=True, exist_ok=True)
    for name in ("part-00000-of-00002.bin", "part-00000-of-00002.bin.sha256"):  # intact, of another cache
        (staging_dir(other, 2) / name).rename(staging_dir(spec, 2) / name)
    with pytest.raises(CacheError, match=r"part-00000-of-00002\.bin was written for key=.*rerun that task"):
        prepare_cache(spec, progress=False)
    assert not spec.directory.exists()


@pytest.mark.slow
def test_hydra_multirun_tasks_then_pretrain_prepare_assembles(tmp_path, texts, cache_root):
    """The multi-machine form on Hydra's basic launcher (SLURM: hydra/launcher=slurm_prepare)."""
    files = [write_jsonl(tmp_path / f"shard-{i}.jsonl", texts[i * 40 : i * 40 + 50]) for i in range(4)]
    overrides = [*local_overrides(files, **{"split.validation_fraction": FRACTION})]
    sweep = tmp_path / "sweep"
    tasks = subprocess.run(
        [
            sys.executable,
            "-m",
            "pretrain.cli.prepare_tasks",
            "--multirun",
            "prepare.tasks=3",
            "prepare.task=range(3)",
        ]
        + overrides
        + [f"hydra.sweep.dir={sweep}"],
        cwd=REPO,
        env=cli_env(cache_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tasks.returncode == 0, tasks.stderr
    spec = cache_spec(compose(*overrides))
    assert sorted(p.name for p in staging_dir(spec, 3).iterdir()) == [
        f"part-{t:05d}-of-00003.bin{suffix}" for t in range(3) for suffix in ("", ".sha256")
    ]
    assembled = subprocess.run(
        prepare_command("prepare.tasks=3", *overrides),
        cwd=REPO,
        env=cli_env(cache_root),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert assembled.returncode == 0, assembled.stderr
    directory = Path(assembled.stdout.strip().splitlines()[-1])
    assert directory == spec.directory and not staging_dir(spec, 3).exists()  # removed once verified
    single = build(compose(*overrides), tmp_path / "single", num_proc=1)
    assert file_digests(directory) == file_digests(single.directory)


# --- kills --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_parquet(tmp_path_factory) -> Path:
    """3,000 distinct documents (~0.7M GPT-2 tokens): three parts, so both workers have work."""
    rng = random.Random(5)
    paragraphs = [english_text(random.Random(i), 1) for i in range(200)]
    texts = [
        f"Entry {i}. " + "\n\n".join(rng.choice(paragraphs) for _ in range(rng.randint(1, 3)))
        for i in range(3000)
    ]
    return write_parquet(
        tmp_path_factory.mktemp("big") / "big.parquet", texts, rows=[{"text": t} for t in texts]
    )


def _children(pid: int) -> dict[int, str]:
    """{pid: command line} of the live processes whose parent is `pid` (from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found[int(entry.name)] = cmdline
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start_workers(cache_root: Path, overrides: list[str]) -> tuple[subprocess.Popen, list[int]]:
    process = subprocess.Popen(
        prepare_command(*overrides),
        cwd=REPO,
        env=cli_env(cache_root),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        workers = [pid for pid, cmd in _children(process.pid).items() if "spawn_main" in cmd]
        if len(workers) == 2:
            return process, workers
        time.sleep(0.01)
    process.kill()
    pytest.fail("the two prepare workers did not start within 60 s")


def test_a_killed_worker_stops_the_build_with_an_error_and_a_rerun_completes(big_parquet, cache_root):
    overrides = ["source=local", f"source.files=['{big_parquet}']", "prepare.num_proc=2"]
    process, workers = _start_workers(cache_root, overrides)
    os.kill(workers[1], signal.SIGKILL)
    out, err = process.communicate(timeout=120)  # an error, not a hang
    assert process.returncode == 2, err
    assert "error: prepare worker" in err and "SIGKILL" in err and "Traceback" not in err
    assert not any(_alive(pid) for pid in workers)  # the other worker was stopped too
    # Nothing verifies: no cache directory, no temporary build left.
    assert [p.name for p in cache_root.iterdir() if not p.name.endswith(".lock")] == []

    # The next prepare (the same cache; in one process here: quicker) builds it.
    rerun = build(compose(*overrides, "prepare.num_proc=1"), cache_root, num_proc=1)
    manifest = verify_cache(rerun.directory)
    assert manifest["build"]["documents_read"] == 3000


def test_a_killed_parent_takes_its_workers_with_it(big_parquet, cache_root):
    overrides = ["source=local", f"source.files=['{big_parquet}']", "prepare.num_proc=2"]
    process, workers = _start_workers(cache_root, overrides)
    children = list(_children(process.pid))  # the workers and multiprocessing's resource tracker
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)
    deadline = time.monotonic() + 30  # a poll limit, not a timing claim: they exit at once
    while time.monotonic() < deadline and any(_alive(pid) for pid in children):
        time.sleep(0.05)
    assert not [pid for pid in children if _alive(pid)], "orphaned prepare processes"
    assert set(workers) <= set(children)
    # Nothing holds the build lock any more: the next prepare starts over without waiting.
    spec = cache_spec(compose(*overrides))
    lock = FileLock(str(cache_root / f"{spec.key}.lock"))
    lock.acquire(timeout=0)  # raises Timeout if a process still held it
    lock.release()
    assert not spec.directory.exists()


# --- source messages (issue 10) -----------------------------------------------------------------


def _build_local(files, root: Path):
    return build(compose(*local_overrides(files)), root, num_proc=1)


def test_an_empty_jsonl_file_is_named_as_having_no_documents(tmp_path, texts):
    good = write_jsonl(tmp_path / "good.jsonl", texts[:3])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(SourceError) as info:
        _build_local([good, empty], tmp_path / "root")
    message = str(info.value)
    assert str(empty) in message and "has no documents" in message and "source.files" in message
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n  \n\n")
    with pytest.raises(SourceError, match=r"blank\.jsonl has no documents"):
        _build_local([blank], tmp_path / "root")


def test_an_empty_parquet_file_is_named_as_having_no_documents(tmp_path):
    empty = write_parquet(tmp_path / "empty.parquet", [])
    with pytest.raises(SourceError, match=r"empty\.parquet has no documents"):
        _build_local([empty], tmp_path / "root")


def test_a_directory_in_source_files_means_its_data_files_in_sorted_order(tmp_path, texts):
    folder = tmp_path / "data"
    b = write_jsonl(folder / "b.jsonl", texts[20:40])
    a = write_parquet(folder / "sub" / "a.parquet", texts[:20])  # sub/a sorts after b.jsonl
    (folder / "notes.txt").write_text("not data")
    explicit = cache_spec(compose(*local_overrides([b, a])))
    listed = cache_spec(compose(*local_overrides([folder])))
    assert listed.identity == explicit.identity
    cache = _build_local([folder], tmp_path / "root")
    assert cache.manifest["build"]["documents_read"] == 40
    empty = tmp_path / "nothing"
    empty.mkdir()
    (empty / "readme.md").write_text("no data here")
    with pytest.raises(SourceError, match=r"the directory .*nothing holds no \.parquet/\.jsonl"):
        cache_spec(compose(*local_overrides([empty])))


def test_a_glob_in_source_files_expands_sorted_and_a_glob_without_match_says_so(tmp_path, texts):
    paths = [write_jsonl(tmp_path / f"part-{i}.jsonl", texts[i * 10 : i * 10 + 10]) for i in (2, 0, 1)]
    pattern = str(tmp_path / "part-*.jsonl")
    assert cache_spec(compose(*local_overrides([pattern]))).identity == (
        cache_spec(compose(*local_overrides(sorted(paths)))).identity
    )
    with pytest.raises(SourceError, match=r"the pattern '.*nope-\*\.parquet' matches no"):
        cache_spec(compose(*local_overrides([str(tmp_path / "nope-*.parquet")])))


# --- FineWeb's parts, offline -------------------------------------------------------------------


def test_fineweb_parts_read_the_configs_parquet_files_in_name_order(tmp_path, texts, monkeypatch):
    """The hub's folder of the pinned revision, served by a local fsspec filesystem: parts are the
    files' row ranges in file-name order, read through the filesystem (nothing reaches the network)."""
    import fsspec

    cfg = compose("source=fineweb", "split.validation_fraction=0.2")
    source = cfg.source
    folder = tmp_path / "datasets" / f"{source.path}@{source.revision}" / source.data_dir
    write_parquet(folder / "001_00000.parquet", texts[60:], row_group_size=9)
    write_parquet(folder / "000_00000.parquet", texts[:60], row_group_size=9)
    (folder / "README.md").write_text("not a data file")
    monkeypatch.chdir(tmp_path)  # the filesystem's paths are relative: datasets/<repo>@<revision>/...
    monkeypatch.setattr(fineweb, "check_hub", lambda path: None)
    monkeypatch.setattr(fineweb, "hub_filesystem", lambda: fsspec.filesystem("file"))
    hub = source_from_config(source, SMALL_PARTS)
    parts = list(hub.parts())
    assert {p.kind for p in parts} == {"parquet"} and len(parts) > 2
    assert {Path(p.path).name for p in parts} == {"000_00000.parquet", "001_00000.parquet"}
    assert [d.text for d in documents(hub)] == texts
    cache = build(cfg, tmp_path / "root", num_proc=1, part_sizes=SMALL_PARTS)
    expected = expected_cache(texts, fraction=0.2)
    for split in ("train", "validation"):
        assert cache.manifest["splits"][split]["documents"] == len(expected[split]["docs"])
        assert cache.manifest["splits"][split]["tokens"] == sum(map(len, expected[split]["docs"]))
