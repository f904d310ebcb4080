"""Train a GPT on the token cache: python train.py [Hydra overrides], e.g. data=padded attn=sdpa."""

import hydra
from omegaconf import DictConfig

from pretrain.config import register_schema
from pretrain.training.rundir import register_run_dir_resolver

register_schema()  # conf/train.yaml is typed by pretrain.config's schema
register_run_dir_resolver()  # ${pretrain.run_dir:...}: SLURM job directories, unique ones elsewhere


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from pretrain.errors import exit_on_user_error
    from pretrain.training.run import train

    with exit_on_user_error():
        summary = train(cfg)
    if summary["exit_code"]:  # stopped by a signal: 128 + its number (143 SIGTERM, 138 SIGUSR1, 130 Ctrl-C)
        raise SystemExit(summary["exit_code"])


if __name__ == "__main__":
    main()
