"""Train a GPT on the token cache: python train.py [Hydra overrides], e.g. data=padded attn=sdpa."""

import hydra
from omegaconf import DictConfig

from pretrain.config import register_schema

register_schema()  # conf/train.yaml is typed by pretrain.config's schema


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from pretrain.errors import exit_on_user_error
    from pretrain.training.run import train

    with exit_on_user_error():
        train(cfg)


if __name__ == "__main__":
    main()
