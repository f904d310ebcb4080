"""`python bench/collector_on.py train.py [overrides]`: train.py with its start-up collector pause
(training/startup_collector.py) switched off, so bench_fixed_costs.py can show what the pause saves
beside the run as it is, in the same rounds."""

from __future__ import annotations

import runpy
import sys

import pretrain.training.startup_collector as collector

collector.pause = lambda: None  # the collector runs through start-up as in any Python program
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
