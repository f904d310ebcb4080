"""`python -m pretrain.config > docs/config.md`: the generated config reference."""

from .reference import markdown_reference

print(markdown_reference(), end="")
