"""Reporting on finished runs: `pretrain compare` (plots and tables of runs, sweeps and arms of seeds)."""
