"""Reporting on finished runs: `pretrain compare` (plots and tables of runs and sweeps)."""
