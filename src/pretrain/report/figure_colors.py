"""The comparison figures' colours and line styles: one colour per policy (the same in every figure,
the registered policies' defaults first), a shade of it per arm or layout of that policy, and a line
style per combination of the other keys the arms differ in."""

from __future__ import annotations

from typing import Any

from .arms import Arm, flat_config

LINE_STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
"""One line style per combination of the swept keys' values."""

PALETTE = tuple(
    f"tab:{c}" for c in ("red", "purple", "blue", "orange", "green", "brown", "pink", "olive", "cyan")
)
"""Arm colours: the registered policies' defaults take the first ones, in registry order."""


def arm_colors(arms: list[str]) -> dict[str, str]:
    """One colour per arm: the registered policies' defaults first (the same colour in every figure),
    then the variants in the order given."""
    from ..data.batching.policies import REGISTRY

    ordered = list(dict.fromkeys([*map(str, REGISTRY), *arms]))
    return {arm: PALETTE[i % len(PALETTE)] for i, arm in enumerate(ordered)}


SHADES = (0.0, -0.4, 0.4, -0.65, 0.6, -0.2, 0.2)
"""The shades of a policy's colour its arms take in turn (negative: toward black, positive: toward
white): the first arm of a policy keeps the policy's own colour (`arm_colors`), the next ones are
darker and lighter, so arms of one policy read as one family yet apart."""


def shade(color: str, amount: float) -> str:
    """`color` mixed toward black (`amount` < 0) or white (> 0) by |amount|; itself at 0."""
    if amount == 0:
        return color
    from matplotlib.colors import to_hex, to_rgb

    target = 0.0 if amount < 0 else 1.0
    red, green, blue = (c + (target - c) * abs(amount) for c in to_rgb(color))
    return str(to_hex((red, green, blue)))


def policy_of(layout: str) -> str:
    """The policy of a layout name (`prepacked strategy=bfd` -> `prepacked`)."""
    return layout.split(" ")[0]


def family_colors(layouts: list[str]) -> list[str]:
    """One colour per entry (an arm or a layout row): its policy's colour (`arm_colors`, the same in
    every figure), in a shade of its own (`SHADES`, in the order given) when entries share a policy."""
    policies = [policy_of(layout) for layout in layouts]
    palette = arm_colors(policies)
    seen: dict[str, int] = {}
    colors = []
    for policy in policies:
        rank = seen[policy] = seen.get(policy, -1) + 1
        colors.append(shade(palette[policy], SHADES[rank % len(SHADES)]))
    return colors


def arm_styles(arms: list[Arm], keys: list[str]) -> tuple[list[str], list[Any]]:
    """(colour, line style) per arm: the colour is a shade of its policy's (`family_colors`), the style
    that of the values of the other keys the arms differ in."""
    combos = [tuple(repr(flat_config(arm.config).get(key)) for key in keys) for arm in arms]
    order = list(dict.fromkeys(combos))
    colors = family_colors([arm.layout for arm in arms])
    return colors, [LINE_STYLES[order.index(combo) % len(LINE_STYLES)] for combo in combos]
