"""Arms: the runs of one setting repeated over seeds, and the labels that tell arms apart.

An arm is the runs whose resolved configs are equal except for `seed` and the keys that name or place
a run without changing what it trains (NOT_SWEPT: output and cache directories, loggers,
`experiment_name`, `arm_name`, ...). Its label is what distinguishes it from the other arms: its
batch layout (the policy and its layout options that differ from the policy's defaults or between the
arms of that policy, `prepacked document_mask=false strategy=concat` beside `prepacked
document_mask=true strategy=bfd`) and the values of the other keys the arms differ in
(`max_seq_len=128`). A run config's `arm_name` is not used: a label read off the config cannot
disagree with what was trained, and two arms that differ only in their names trained the same thing
(they are one arm). A run without a config is an arm of its own, labelled by its directory's name.
Arms keep the order of their first run (the order `find_runs` found them in).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..training.run_record import Run, layout_options, policy_layout_options

log = logging.getLogger(__name__)

SEED = "seed"
"""The key whose values are an arm's repeats."""
NOT_SWEPT = (
    "output_dir",
    "ckpt_path",
    "cache_root",  # where caches live: a cache is found by its content's identity, not its place
    "experiment_name",
    "arm_name",
    "progress_bar",
    "record_batches",
    "eval.downstream",  # and eval.downstream_limit: what is scored after training, not what is trained
    "logger.",
    "hydra.",
)
"""Keys that differ between runs without changing what they train."""


def policy_keys() -> set[str]:
    """`data.policy` and every registered policy's layout options: the keys that make a run's layout."""
    from ..data.batching.policies import REGISTRY

    return {"data.policy"} | {
        f"data.{k}" for cls in REGISTRY.values() for k in layout_options(cls.config_class)
    }


def flat_config(config: dict, prefix: str = "") -> dict[str, object]:
    """`{"data": {"policy": "padded"}}` -> `{"data.policy": "padded"}`; lists become tuples."""
    flat: dict[str, object] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flat_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
    return flat


def swept_keys(runs: list[Run], ignored: tuple[str, ...] = ()) -> list[str]:
    """The config keys whose values differ between the runs, besides the layout's own (`policy_keys`),
    `ignored` and those that change nothing trained (NOT_SWEPT) or that only some runs' policies have:
    what a sweep varies. A key that only repeats an earlier one (`model.max_seq_len` follows
    `data.max_seq_len`) is left out."""
    flats = [flat_config(run.config) for run in runs]
    kept: dict[tuple[str, tuple[str, ...]], str] = {}
    layout_keys = policy_keys()
    for key in sorted(set().union(*flats)) if flats else []:
        values = tuple(repr(flat.get(key)) for flat in flats)
        if key in layout_keys or key in ignored or key.startswith(NOT_SWEPT) or len(set(values)) < 2:
            continue
        if not all(key in flat for flat in flats):  # one policy's own option (data.packing_buffer)
            continue
        kept.setdefault((key.split(".")[-1], values), key)
    return list(kept.values())


def setting(run: Run) -> tuple[tuple[str, str], ...]:
    """What a run trained, seeds aside: its config's keys and values without `seed` and NOT_SWEPT
    (a run without a config: its directory, so it is an arm of its own)."""
    if not run.config:
        return (("path", str(run.path)),)
    flat = flat_config(run.config)
    return tuple(
        sorted(
            (key, repr(value)) for key, value in flat.items() if key != SEED and not key.startswith(NOT_SWEPT)
        )
    )


@dataclass
class Arm:
    """The runs of one setting; `label` tells it apart from the other arms."""

    label: str
    runs: list[Run]

    @property
    def n(self) -> int:
        return len(self.runs)

    @property
    def layout(self) -> str:
        """The batch layout its runs share (`prepacked strategy=concat`): its colour in the figure."""
        return self.runs[0].arm

    @property
    def seeds(self) -> list[object]:
        return [run.config.get(SEED) for run in self.runs]

    @property
    def config(self) -> dict:
        return self.runs[0].config


def group_arms(runs: list[Run]) -> list[Arm]:
    """The runs grouped into arms (in the order of each arm's first run), labelled by `label_arms`.
    A seed an arm already holds is one run, not a second seed (two runs of one seed would count as
    n = 2 with a spread of rounding noise): the first found is kept, and a warning names the others."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        members = groups.setdefault(setting(run), [])
        twin = next(
            (
                kept
                for kept in members
                if run.config and repr(kept.config.get(SEED)) == repr(run.config.get(SEED))
            ),
            None,
        )
        if twin is not None:
            log.warning(
                f"{run.path} repeats seed {run.config.get(SEED)} of {twin.path} with the same settings: "
                f"left out (one seed is one sample; give repeats another seed=)"
            )
            continue
        members.append(run)
    arms = [Arm("", members) for members in groups.values()]
    label_arms(arms)
    return arms


def _spelled(value: object) -> str:
    """A layout option's value as an override spells it: `false`, `concat`."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def layout_label(arm: Arm, arms: list[Arm]) -> str:
    """The arm's policy and each of its layout options that is not at the policy's default or that
    varies among the arms of that policy (`prepacked document_mask=false strategy=concat` beside
    `prepacked document_mask=true strategy=bfd`): a default is named where it tells arms apart."""
    data = arm.config.get("data") or {}
    policy, options = policy_layout_options(data)
    if options is None:  # a policy this version does not know: its name alone
        return policy
    siblings = [
        other.config.get("data") or {}
        for other in arms
        if (other.config.get("data") or {}).get("policy") == policy
    ]
    shown = []
    for key, default in options.items():
        value = _spelled(data.get(key, default))
        varies = len({_spelled(sibling.get(key, default)) for sibling in siblings}) > 1
        if varies or value != _spelled(default):
            shown.append(f"{key}={value}")
    return " ".join([policy, *shown])


def label_arms(arms: list[Arm]) -> list[str]:
    """Set each arm's label to its layout (`layout_label`) and the values of the other keys the arms
    differ in (`padded max_seq_len=128`); returns those keys. Arms still alike (they differ in a key only some
    of them have, or have no config) add the keys they differ in, or their first run's directory."""
    keys = swept_keys([arm.runs[0] for arm in arms], ignored=(SEED,))
    for arm in arms:
        flat = flat_config(arm.config)
        swept = " ".join(f"{key.split('.')[-1]}={flat.get(key)}" for key in keys)
        arm.label = f"{layout_label(arm, arms)} {swept}".strip() if arm.config else arm.runs[0].path.name
    for label, count in Counter(arm.label for arm in arms).items():
        if count > 1:
            alike = [arm for arm in arms if arm.label == label]
            for arm, extra in zip(alike, _what_differs(alike), strict=True):
                arm.label = f"{label} {extra}".strip()
    return keys


def _what_differs(arms: list[Arm]) -> list[str]:
    """For arms with one label: the `key=value` pairs in which each differs from the others (every key
    in full, missing ones as `None`), else the end of its first run's path that tells it apart."""
    settings = [
        {key: str(value) for key, value in flat_config(arm.config).items() if (key, repr(value)) in kept}
        for arm, kept in ((arm, set(setting(arm.runs[0]))) for arm in arms)
    ]
    keys = sorted({key for s in settings for key in s if len({s.get(key) for s in settings}) > 1})
    where = distinguishing_paths([arm.runs[0].path for arm in arms])
    return [
        " ".join(f"{key}={s.get(key, 'None')}" for key in keys) or f"({path})"
        for s, path in zip(settings, where, strict=True)
    ]


def distinguishing_paths(paths: list[Path]) -> list[str]:
    """The shortest trailing parts of the paths (at least the last one) that differ for every path."""
    parts = [Path(path).resolve().parts for path in paths]
    for depth in range(1, max(len(p) for p in parts) + 1):
        tails = ["/".join(p[-depth:]) for p in parts]
        if len(set(tails)) == len(tails):
            return tails
    return [str(path) for path in paths]
