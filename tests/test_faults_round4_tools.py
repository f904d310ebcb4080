"""Reliability, round 4 (issue 42), the tools around training: `pretrain compare` on many identical
seeds (item 6) and scripts/slurm_local.sh's usage errors (item 7)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO
from test_compare_seeds import write_run

from pretrain.report.compare import compare
from pretrain.report.statistics import mean_points

# --- item 6: identical seeds never make an error bar's extent negative -----------------------------


def test_the_band_of_identical_seeds_holds_their_mean_at_any_count():
    """The mean of the k-th validations (summed down the seeds) and the band's own mean (summed along
    one value list) round differently: the band is widened to hold the mean, never left 1e-14 short."""
    for seeds in range(2, 501):
        dots = mean_points([[(200.0, 4.4), (400.0, 3.1)]] * seeds)
        assert dots is not None
        assert (dots.mean - dots.low >= 0).all() and (dots.high - dots.mean >= 0).all(), seeds
        np.testing.assert_allclose(dots.mean, [4.4, 3.1], rtol=1e-12)


@pytest.mark.parametrize("seeds", [50, pytest.param(500, marks=pytest.mark.slow)])
def test_compare_plots_two_arms_of_many_identical_seeds(tmp_path, seeds):
    """2 arms x 500 seeds with identical values died in matplotlib's errorbar ("'yerr' must not
    contain negative values"); 50 seeds a arm already did."""
    root = tmp_path / "multirun"
    runs = [
        write_run(root / f"{policy}-{seed}", policy=policy, seed=seed, train_loss=3.1, val=(4.4, 3.1))
        for policy in ("padded", "bestfit")
        for seed in range(seeds)
    ]
    png = compare(runs, output=tmp_path / "compare.png", quiet=True)
    assert png.is_file() and png.stat().st_size > 0


# --- item 7: slurm_local.sh's usage errors exit 2 and start nothing ---------------------------------

SCRIPT = REPO / "scripts" / "slurm_local.sh"
# Every command the script could run to install or start Slurm: here a stub that records its call.
COMMANDS = ("apt-get", "slurmctld", "slurmd", "munged", "mungekey", "runuser", "srun", "sinfo", "scontrol")


@pytest.mark.parametrize("args", [["bogus"], [""], [], ["start", "extra"]], ids=repr)
def test_slurm_local_refuses_a_missing_empty_or_unknown_action_with_exit_2(tmp_path, args):
    stubs, calls = tmp_path / "bin", tmp_path / "calls"
    stubs.mkdir()
    for name in COMMANDS:
        stub = stubs / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >> "{calls}"\n')
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_CONF": str(tmp_path / "slurm.conf")}
    proc = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "usage:" in lines[0] and "start|stop|status" in lines[0], proc.stderr
    assert not calls.exists(), calls.read_text()  # nothing installed, written or started
    assert not Path(env["SLURM_CONF"]).exists()


def test_slurm_local_help_prints_the_usage():
    proc = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stdout.startswith("usage:"), proc.stderr
