"""Reliability, round 4 (issue 42 item 12): Ctrl-C and SIGTERM to a `pretrain` subcommand once it is
under way exit 130 and 143 with nothing half-written. Each command runs under a probe that pauses it
just before it renames its finished output into place (a temporary file or staging folder complete,
the output not there yet: the moment a kill would leave the most behind), and gets the signal there."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SHARED_CACHE, TINY_RUN, cli_env, module_cache_root

from pretrain.config import load_config
from pretrain.training.run import train

cache_root = module_cache_root(SHARED_CACHE)
SMALL = [*TINY_RUN, "progress_bar=false"]
REPO = Path(__file__).resolve().parents[1]
UNDER_WAY = "PROBE: under way"

# `pretrain ARGS` paused at the first os.replace / os.rename whose destination matches argv[1].
_PAUSED = f"""
import os, re, sys, time
pattern = re.compile(sys.argv[1])
def paused(real):
    def rename(src, dst, *args, **kwargs):
        if pattern.search(str(dst)):
            print({UNDER_WAY!r}, file=sys.stderr, flush=True)
            time.sleep(120)
        return real(src, dst, *args, **kwargs)
    return rename
os.replace, os.rename = paused(os.replace), paused(os.rename)
from pretrain.cli import main
raise SystemExit(main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, cache_root) -> Path:
    out = tmp_path_factory.mktemp("saved") / "run"
    train(load_config([*SMALL, f"output_dir={out}", "train.max_steps=2"]))
    return out


def _stopped(signum: int, pattern: str, args: list[str], cache: Path) -> tuple[int, str]:
    """Start `pretrain args`, send `signum` once it is paused under way; its exit status and stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _PAUSED, pattern, *args],
        cwd=REPO,
        env={**cli_env(cache), "PYTHONPATH": str(REPO / "src")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    seen = []
    try:
        for line in proc.stderr:  # until the probe says so, or the command ended without pausing
            seen.append(line)
            if line.strip() == UNDER_WAY:
                proc.send_signal(signum)
                break
        rest = proc.stderr.read()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(seen) + rest
    assert UNDER_WAY in err, err[-3000:]
    return proc.returncode, err


def _left(folder: Path) -> list[str]:
    """Whatever is under `folder` (temporaries included), relative to it."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def _case(name: str, tmp_path: Path, saved_run: Path, cache_root: Path):
    """A subcommand's arguments, the rename it pauses at, the cache root it uses, and the folder that
    must hold nothing afterwards."""
    out = tmp_path / "out"
    out.mkdir()
    ckpt = str(saved_run / "checkpoints" / "last.ckpt")
    if name == "prepare":  # a cache of its own: built, paused before its folder is renamed into place
        own = tmp_path / "cache"
        return ["prepare", *SMALL], rf"^{re.escape(str(own))}/[^./][^/]*$", own, own
    cases = {
        "inspect-data": (["inspect-data", *SMALL, f"output={out / 'stats.json'}"], r"stats\.json$"),
        "eval": (["eval", ckpt, "eval.context=[32]", f"output={out / 'eval.json'}"], r"eval\.json$"),
        "export": (["export", ckpt, "--output", str(out / "hf")], r"/out/hf$"),
        "compare": (["compare", str(saved_run), "--output", str(out / "compare.png")], r"/out/compare\."),
    }
    args, pattern = cases[name]
    return args, pattern, cache_root, out


@pytest.mark.parametrize("name", ["prepare", "inspect-data", "eval", "export", "compare"])
def test_ctrl_c_under_way_exits_130_with_nothing_half_written(tmp_path, saved_run, cache_root, name):
    if name == "export":
        pytest.importorskip("transformers")
    args, pattern, cache, folder = _case(name, tmp_path, saved_run, cache_root)
    code, err = _stopped(signal.SIGINT, pattern, args, cache)
    assert code == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err
    left = _left(folder)
    assert all(p.endswith(".lock") for p in left) if name == "prepare" else left == [], left


@pytest.mark.parametrize("name", ["export", "eval"])
def test_sigterm_under_way_exits_143_and_removes_what_it_staged(tmp_path, saved_run, cache_root, name):
    if name == "export":
        pytest.importorskip("transformers")
    args, pattern, cache, folder = _case(name, tmp_path, saved_run, cache_root)
    code, err = _stopped(signal.SIGTERM, pattern, args, cache)
    assert code == 143, err[-3000:]
    assert err.strip().splitlines()[-1] == "terminated" and "Traceback" not in err
    assert _left(folder) == []  # export: no `.hf.<pid>.export` staging folder until the next export
