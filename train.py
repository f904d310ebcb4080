"""Train a GPT on the token cache: python train.py [Hydra overrides], e.g. data=padded attn=sdpa."""

import hydra
from omegaconf import DictConfig


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from pretrain.training.cli import train_main

    train_main(cfg)


if __name__ == "__main__":
    main()
