"""`pretrain prepare` as a Hydra app, for preparing a corpus as many tasks (prepare.py: the subcommand).

One machine: `pretrain prepare` (`prepare.num_proc` worker processes). Many machines: one task per
shard of the source on an existing launcher (Hydra multirun, e.g. SLURM through submitit), then one
assembly that writes the same cache a single machine would have written and verifies it:

    python -m pretrain.cli.prepare_tasks --multirun hydra/launcher=slurm_prepare \\
        prepare.tasks=8 'prepare.task=range(8)' source=local 'source.files=[/data/fineweb]'
    pretrain prepare prepare.tasks=8 source=local 'source.files=[/data/fineweb]'     # assemble

Each task writes its part file (the digests, tokens and source order of its shard's documents)
atomically into `<cache_root>/.<key>.parts-<tasks>/`; the assembly reads them in source order, applies
dedup and budgets exactly as a one-machine build, and removes the staging directory once the cache
verified. `pretrain prepare prepare.tasks=8 prepare.task=3` runs one task by hand.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from ..config import CONFIG_NAME, config_dir, register_schema
from .prepare import run_prepare


def _register() -> None:
    register_schema()
    try:  # the run-directory resolver conf/train.yaml uses (train.py registers it too); no torch import
        from ..training.rundir import register_run_dir_resolver
    except ImportError:
        return
    register_run_dir_resolver()


_register()


@hydra.main(config_path=str(config_dir()), config_name=CONFIG_NAME, version_base="1.3")
def main(cfg: DictConfig) -> None:
    from ..config import to_config
    from ..errors import exit_on_user_error

    with exit_on_user_error():
        path, _ = run_prepare(to_config(cfg), progress=sys.stderr.isatty())
    print(path, flush=True)


if __name__ == "__main__":
    main()
