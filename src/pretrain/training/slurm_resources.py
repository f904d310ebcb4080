"""What a Slurm job of `hydra/launcher=slurm` asks for (conf/hydra/launcher/slurm.yaml), from the trainer:
one task per device on each of `trainer.num_nodes` nodes (Lightning's SLURM environment checks that
srun started devices x num_nodes tasks), and GPUs only when the trainer uses them (a GPU request on
CPU nodes is refused by sbatch: "Invalid generic resource (gres) specification").
Light on purpose: train.py registers the resolvers before Hydra starts.
"""

from __future__ import annotations


def tasks_per_node(devices: object) -> int:
    """`trainer.devices` as a task count: a positive number (-1 or "auto" cannot size a job)."""
    from ..errors import ConfigError

    try:
        count = int(str(devices))
    except ValueError:
        count = 0
    if count < 1:
        raise ConfigError(
            f"trainer.devices={devices} cannot size a Slurm job (one task per device): set "
            "trainer.devices to the devices each node uses, e.g. trainer.devices=8"
        )
    return count


def gpus_per_node(accelerator: str, devices: object) -> int:
    """0 on CPU (trainer=cpu, trainer.accelerator=cpu), else one GPU per task."""
    return 0 if str(accelerator) == "cpu" else tasks_per_node(devices)


def register_slurm_resolvers() -> None:
    """`${pretrain.slurm_tasks:DEVICES}` and `${pretrain.slurm_gpus:ACCELERATOR,DEVICES}`."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("pretrain.slurm_tasks", tasks_per_node, replace=True)
    OmegaConf.register_new_resolver("pretrain.slurm_gpus", gpus_per_node, replace=True)
