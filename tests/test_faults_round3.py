"""Reliability, round 3 (issue 28): no run is overwritten or mislabelled, and every write path and bad
value is one `error:` line with exit 2, nothing lost and no partial file."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import SHARED_CACHE, TINY_RUN, module_cache_root

from pretrain import cli, fileio
from pretrain.checkpoints.files import newest_valid_checkpoint
from pretrain.config import load_config, to_config
from pretrain.errors import CheckpointError, ConfigError
from pretrain.training.run import train
from pretrain.training.rundir import LOCK_NAME, RunLock

cache_root = module_cache_root(SHARED_CACHE)
SMALL = [*TINY_RUN, "progress_bar=false"]
REPO = Path(__file__).resolve().parents[1]


def compose(out: Path, *overrides: str):
    return load_config([*SMALL, f"output_dir={out}", *overrides])


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != LOCK_NAME
    }


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, cache_root) -> Path:
    """A finished run with step000001, step000002 and last.ckpt."""
    out = tmp_path_factory.mktemp("saved") / "run"
    train(compose(out, "train.max_steps=2", "train.checkpoint_every_n_steps=1", "train.warmup_steps=0"))
    return out


def _copy(saved_run: Path, to: Path) -> Path:
    shutil.copytree(saved_run, to)
    return to


# --- item 1: a fresh run never overwrites another run's checkpoints -------------------------------


def test_a_fresh_run_into_another_runs_checkpoints_is_refused_and_start_over_replaces_them(
    tmp_path, saved_run
):
    run = _copy(saved_run, tmp_path / "run")
    before = _digests(run)
    with pytest.raises(ConfigError, match=r"holds another run's checkpoints \(last\.ckpt, step000001"):
        train(compose(run, "train.max_steps=1", "train.warmup_steps=0"))
    assert _digests(run) == before  # nothing of the other run touched
    assert newest_valid_checkpoint(run) == run / "checkpoints" / "last.ckpt"

    # start_over=true: the old run's checkpoints go first, so ckpt_path=auto finds only the new run's.
    summary = train(
        compose(
            run,
            "train.max_steps=1",
            "train.warmup_steps=0",
            "train.checkpoint_every_n_steps=1",
            "start_over=true",
        )
    )
    assert summary["steps"] == 1
    names = sorted(p.name for p in (run / "checkpoints").glob("*.ckpt"))
    # the new run's step 1 is last.ckpt alone (never two files for one step); the other run's are gone
    assert names == ["last.ckpt"]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 1
    with pytest.raises(ConfigError, match="start_over=true deletes .* choose one of them"):
        train(compose(run, "start_over=true", "ckpt_path=auto"))


_HOLD = """
import sys, time
from pathlib import Path
from pretrain.training.rundir import RunLock
lock = RunLock(Path(sys.argv[1])).acquire()  # held while the object lives
print("locked", flush=True)
time.sleep(120)
"""


def _train_py(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, "train.py", *SMALL, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_train_py_refusals_leave_the_live_runs_hydra_files_as_they_were(tmp_path, saved_run):
    """Items 1 and 2 through `python train.py`: Hydra writes .hydra/ and train.log before the job runs,
    so the lock and the fresh-start check come first."""
    run = _copy(saved_run, tmp_path / "run")
    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text("data:\n  policy: bestfit\n")
    (run / ".hydra" / "overrides.yaml").write_text("- data=bestfit\n")
    before = _digests(run)

    proc = _train_py(f"hydra.run.dir={run}", "data=padded")  # a fresh run onto its checkpoints
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: {run / 'checkpoints'} holds another run's")
    assert "start_over=true" in lines[0]
    assert _digests(run) == before and not (run / "train.log").exists()

    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(run)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        proc = _train_py(f"hydra.run.dir={run}", "data=padded", "ckpt_path=auto")
    finally:
        holder.kill()
        holder.wait()
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: {run} is in use by pid {holder.pid}")
    assert _digests(run) == before and not (run / "train.log").exists()


def test_the_lock_never_follows_a_symlink_and_a_directory_is_named_as_the_lock(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / LOCK_NAME).symlink_to(victim)
    with pytest.raises(ConfigError, match=rf"the run lock {linked / LOCK_NAME} is a symbolic link"):
        RunLock(linked).acquire()
    assert victim.read_text() == "keep me\n"

    folder = tmp_path / "folder"
    (folder / LOCK_NAME).mkdir(parents=True)
    with pytest.raises(ConfigError, match=rf"the run lock {folder / LOCK_NAME} is a directory, not a lock"):
        RunLock(folder).acquire()
    RunLock(tmp_path / "plain").acquire().release()


# --- item 3: inspect-data's and compare's outputs: checked before the work, written atomically ---

DROP = "-dac_override,-dac_read_search,-fowner"
SETPRIV = ["setpriv", f"--inh-caps={DROP}", f"--bounding-set={DROP}"]
needs_setpriv = pytest.mark.skipif(
    shutil.which("setpriv") is None, reason="setpriv (util-linux) drops root's capabilities"
)


class _FullDisk:
    """A file handle on a disk that fills after the first byte."""

    def __init__(self, handle):
        self._handle = handle

    def write(self, data):
        self._handle.write(data[:1])
        self._handle.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._handle.close()


def _fill_the_disk(monkeypatch) -> None:
    """Every write through pretrain.fileio (atomic writes) meets a full disk."""
    real = open

    def opening(path, mode="r", *args, **kwargs):
        handle = real(path, mode, *args, **kwargs)
        return _FullDisk(handle) if "w" in mode else handle

    monkeypatch.setattr(fileio, "open", opening, raising=False)


def _one_error_line(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_inspect_data_output_is_checked_first_and_a_full_disk_leaves_nothing(
    tmp_path, saved_run, capsys, monkeypatch
):
    folder = tmp_path / "out"
    folder.mkdir()
    (tmp_path / "a-file").write_text("x")
    inspect = ["inspect-data", *SMALL]
    cases = {
        str(
            folder
        ): f"error: output={folder} is a directory: give a file name, e.g. output={folder}/stats.json",
        str(tmp_path / "a-file" / "s.json"): f"error: output={tmp_path / 'a-file' / 's.json'}: "
        f"{tmp_path / 'a-file'} is a file, not a folder; pick another output=FILE",
    }
    for output, says in cases.items():
        assert _one_error_line(capsys, [*inspect, f"output={output}"]) == says
    _fill_the_disk(monkeypatch)
    line = _one_error_line(capsys, [*inspect, f"output={folder / 'stats.json'}"])
    assert line.startswith(f"error: could not write {folder / 'stats.json'}: No space left on device")
    assert list(folder.iterdir()) == []  # no 0-byte stats.json, no temporary


def test_compare_output_is_checked_first_and_a_full_disk_leaves_nothing(
    tmp_path, saved_run, capsys, monkeypatch
):
    run = _copy(saved_run, tmp_path / "run")
    before = sorted(p.name for p in run.iterdir())
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "plots.png").mkdir()
    says = {
        str(tmp_path / "plots.png"): f"error: --output {tmp_path / 'plots.png'} is a directory",
        str(tmp_path / "a-file" / "c.png"): f"error: --output {tmp_path / 'a-file' / 'c.png'}: "
        f"{tmp_path / 'a-file'} is a file, not a folder; pick another --output FILE.png",
    }
    for output, start in says.items():
        assert _one_error_line(capsys, ["compare", str(run), "--output", output]).startswith(start)
    _fill_the_disk(monkeypatch)
    line = _one_error_line(capsys, ["compare", str(run)])
    assert line.startswith("error: compare: ") and "No space left on device" in line, line
    assert sorted(p.name for p in run.iterdir()) == before  # no compare.png, no .md, no temporary


@needs_setpriv
def test_read_only_outputs_of_inspect_data_and_compare_are_one_line(tmp_path, saved_run):
    run = _copy(saved_run, tmp_path / "run")
    read_only = tmp_path / "ro"
    read_only.mkdir()
    for folder in (read_only, run):
        folder.chmod(0o555)
    pretrain = [sys.executable, "-m", "pretrain.cli"]
    cases = {
        (*pretrain, "inspect-data", *SMALL, f"output={read_only / 's.json'}"): (
            f"error: output={read_only / 's.json'}: {read_only} is not writable; pick another output=FILE"
        ),
        (*pretrain, "compare", str(run), "--output", str(read_only / "c.png")): (
            f"error: --output {read_only / 'c.png'}: {read_only} is not writable; pick another --output"
        ),
        (*pretrain, "compare", str(run)): (
            f"error: --output {run / 'compare.png'} (the default): {run} is not writable; pick another"
        ),
    }
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    try:
        for args, says in cases.items():
            proc = subprocess.run(
                [*SETPRIV, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
            )
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 2, proc.stderr[-2000:]
            assert len(lines) == 1 and lines[0].startswith(says), lines
    finally:
        run.chmod(0o755)
    assert list(read_only.iterdir()) == [] and not (run / "compare.png").exists()


# --- item 4: export on a full disk, as safetensors reports it ---------------------------------------


def test_export_when_safetensors_meets_a_full_disk_is_one_line(tmp_path, saved_run, capsys, monkeypatch):
    pytest.importorskip("transformers")
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*args, **kwargs):  # what safetensors raises itself: not an OSError
        raise SafetensorError(
            'Error while serializing: I/O error: No space left on device (os error 28) at path "x"'
        )

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    target = tmp_path / "hf"
    line = _one_error_line(
        capsys, ["export", str(saved_run / "checkpoints" / "last.ckpt"), "--output", str(target)]
    )
    assert line == (
        f"error: could not write the export to {target}: No space left on device; free disk space or "
        "pick another --output (nothing was left behind)"
    )
    assert list(tmp_path.iterdir()) == []


# --- item 5: compare on a run whose config.yaml is malformed ---------------------------------------


@pytest.mark.parametrize(
    ("text", "says"), [("data: [unclosed\n", "is not valid YAML at line 2"), ("- 1\n", "holds no config")]
)
def test_compare_names_a_malformed_config_yaml_in_one_line(tmp_path, saved_run, capsys, text, says):
    run = _copy(saved_run, tmp_path / "run")
    (run / "config.yaml").write_text(text)
    line = _one_error_line(capsys, ["compare", str(run)])
    assert line.startswith(f"error: {run / 'config.yaml'} {says}"), line
    assert line.endswith(f"or leave {run} out of the comparison")
    assert not (run / "compare.png").exists()


# --- item 7: a checkpoint whose weights do not fit its own settings ----------------------------------


def test_a_checkpoint_with_a_tensor_of_another_shape_is_one_line_in_training_and_eval(
    tmp_path, saved_run, capsys
):
    import torch

    from pretrain.checkpoints.files import save_verified

    checkpoint = torch.load(saved_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    name = next(k for k in checkpoint["state_dict"] if k.endswith("ln_f.weight"))
    checkpoint["state_dict"][name] = torch.ones(48)  # d_model is 32: same settings, another shape
    bad = tmp_path / "bad.ckpt"
    save_verified(checkpoint, bad)  # with its record: it passes verification and weights_only
    says = rf"tensor {name.removeprefix('model.')} has shape \(48,\), the model needs \(32,\)"
    out = tmp_path / "run"
    with pytest.raises(CheckpointError, match=rf"ckpt_path={bad}: {says}"):
        train(compose(out, f"ckpt_path={bad}", "train.max_steps=4"))
    assert not out.exists()
    line = _one_error_line(capsys, ["eval", str(bad)])
    assert re.match(rf"error: {bad}: {says}", line), line


# --- item 8: values that passed the range checks ---------------------------------------------------


@pytest.mark.parametrize(
    ("weight", "says"), [("inf", "must be a finite number > 0, got inf"), ("nan", "must be > 0, got nan")]
)
def test_an_infinite_or_nan_mixture_weight_is_refused(weight, says):
    with pytest.raises(ConfigError) as error:
        to_config(load_config(["mixture=pydocs_repo", f"mixture.components.pydocs.weight={weight}"]))
    assert str(error.value) == f"mixture.components.pydocs.weight {says}"


def test_a_huge_open_bins_is_capped_at_the_number_of_chunks():
    import numpy as np

    from pretrain.data.batching.packing import first_fit_online

    lengths = np.array([5, 9, 3, 7, 12, 2], dtype=np.int32)
    capped = first_fit_online(lengths, 16, 10**9)  # would allocate four arrays of 10**9
    for got, want in zip(capped, first_fit_online(lengths, 16, len(lengths)), strict=True):
        assert np.array_equal(got, want)
    order = np.array([4, 0, 2], dtype=np.int64)
    items, _ = first_fit_online(lengths, 16, 10**9, order=order)
    assert sorted(items.tolist()) == [0, 2, 4]


def _mixed_sampler(small_tokens: int, batch_size: int, caplog):
    import numpy as np
    from helpers import policy_cfg

    from pretrain.data.batching.mixture import mix_splits
    from pretrain.data.batching.samplers import build_sampler
    from pretrain.data.tokens import TokenSplit

    big = TokenSplit.from_lengths(np.full(200, 40), seed=1)
    small = TokenSplit.from_lengths(np.array([small_tokens]), seed=2)
    split, mixture = mix_splits([big, small], ("web", "tiny"), (0.5, 0.5), (1, 1))
    settings = policy_cfg("bestfit", "data.max_seq_len=32", f"train.batch_size={batch_size}")
    with caplog.at_level("WARNING", logger="pretrain.data.batching.mixture"):
        return build_sampler(settings, split, mixture=mixture)


def test_a_component_too_small_for_one_batch_is_named_and_a_tiny_mixed_epoch_warns(caplog):
    from types import SimpleNamespace

    from pretrain.training.fit import EpochFits

    sampler = _mixed_sampler(5, 4, caplog)
    warned = [r.getMessage() for r in caplog.records if r.name == "pretrain.data.batching.mixture"]
    assert len(warned) == 1 and warned[0].startswith("the mixed epoch is only ")
    assert "mixture component 'tiny' limits it (" in warned[0]
    trainer = SimpleNamespace(datamodule=SimpleNamespace(train_sampler=sampler), world_size=1)
    with pytest.raises(ConfigError) as error:
        EpochFits().on_train_start(trainer, None)  # type: ignore[arg-type]
    message = str(error.value)
    assert message.startswith("the mixed epoch has ") and "less than train.batch_size=4" in message
    assert "mixture component 'tiny' limits it" in message and "raise that component's budget" in message
    caplog.clear()
    _mixed_sampler(4000, 1, caplog)  # a component of 4,000 tokens: no warning
    assert not [r for r in caplog.records if r.name == "pretrain.data.batching.mixture"]


# --- item 11: the default warmup fits a short run; a warmup the user sets is checked as given -------


def test_a_short_run_scales_the_default_warmup_down_in_one_line_and_refuses_an_explicit_one(
    capsys, monkeypatch
):
    from pretrain.config import schema

    monkeypatch.setattr(schema, "_SAID", set())
    config = to_config(load_config(["train.max_steps=8"]))
    to_config(load_config(["train.max_steps=8"]))  # typed again (train.py, then the run): said once
    assert config.train.warmup_steps is None and config.train.warmup == 0
    assert capsys.readouterr().err == (
        "train.warmup_steps: the default 20 is more than train.max_steps=8; warming up for 0 updates "
        "instead (set train.warmup_steps to choose)\n"
    )
    assert to_config(load_config(["train.max_steps=50"])).train.warmup == 20
    assert capsys.readouterr().err == ""
    with pytest.raises(ConfigError, match=r"train\.warmup_steps=20 must be <= train\.max_steps=8"):
        to_config(load_config(["train.max_steps=8", "train.warmup_steps=20"]))


# --- item 9: keys outside the schema, added with `+` or not, are refused with the keys that exist ---


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            ["data=padded", "+data.document_mask=false"],
            "data.document_mask: no such key; data=padded has: policy, max_seq_len, long_docs, pad_to",
        ),
        (
            ["data=bestfit", "+data.open_bins=1"],
            "data.open_bins: no such key; data=bestfit has: policy, "
            "max_seq_len, long_docs, document_mask, positions, packing_buffer",
        ),
        (["+train.learning_rate=0.5"], "train.learning_rate: no such key; train has: batch_size, "),
        (["+foo=bar"], "foo: no such key; the config's root has: experiment_name, seed, "),
        (
            ["mixture=pydocs_repo", "+mixture.components.repo.wieght=1"],
            "mixture.components.repo.wieght: no such key; mixture.components.repo has: weight, max_repeat,",
        ),
        (["train.learning_rate=0.5"], "Could not override 'train.learning_rate': no such key; train has: "),
    ],
)
def test_a_key_the_schema_does_not_hold_is_refused_at_composition(overrides, says):
    with pytest.raises(ConfigError) as error:
        load_config(overrides)
    assert str(error.value).startswith(says), str(error.value)
    assert "+" not in str(error.value)  # Hydra's hint to append it is not repeated


def test_train_py_refuses_an_added_key_before_any_directory(tmp_path):
    run = tmp_path / "run"
    proc = _train_py(f"hydra.run.dir={run}", "+train.learning_rate=0.5")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("error: train.learning_rate: no such key; train has: ")
    assert not run.exists()


# --- item 10: a mixture's policy and its components' sources are refused before any directory ------


def test_train_py_refuses_a_mixture_it_cannot_run_before_making_the_run_directory(tmp_path):
    cases = {
        "data=prepacked": "error: data=prepacked packs one fixed token stream ahead of time",
        "mixture.components.pydocs.source.kind=fineweb": (
            "error: mixture.components.pydocs.source: source=fineweb needs source.path, "
        ),
    }
    for override, says in cases.items():
        run = tmp_path / override.split("=")[0]
        proc = _train_py(f"hydra.run.dir={run}", "mixture=pydocs_repo", override)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert len(lines) == 1 and lines[0].startswith(says), lines
        assert not run.exists()


# --- item 6: a run directory that cannot be written even as root, or on a disk already full -------


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs filled to the last byte (skipped where it cannot be mounted)."""
    mount = tmp_path / "full"
    mount.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_train_py_on_a_full_disk_or_under_sys_is_one_line_and_leaves_nothing(tmp_path, full_disk):
    cases = {
        full_disk / "run": f"error: cannot create the run directory {full_disk / 'run'}: cannot write in "
        f"{full_disk} (No space left on device); free disk space or run elsewhere",
        Path("/sys/pretrain-test-run"): "error: cannot create the run directory /sys/pretrain-test-run: "
        "cannot write in /sys (",
    }
    for run, says in cases.items():
        proc = _train_py(f"hydra.run.dir={run}")
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert len(lines) == 1 and lines[0].startswith(says), lines
        assert not run.exists()
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]  # no probe left behind


def test_the_resume_command_of_a_run_that_started_over_does_not_start_over_again(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from hydra.core.hydra_config import HydraConfig

    from pretrain.training import summary as run_module

    task = ["train.max_steps=9", "start_over=true", f"hydra.run.dir={tmp_path}"]
    monkeypatch.setattr(run_module, "hydra_mode", lambda: "RUN")
    monkeypatch.setattr(
        HydraConfig, "get", staticmethod(lambda: SimpleNamespace(overrides=SimpleNamespace(task=task)))
    )
    command = run_module.resume_command(tmp_path)
    assert command == f"python train.py train.max_steps=9 hydra.run.dir={tmp_path} ckpt_path=auto"
