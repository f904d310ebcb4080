"""Reliability, round 4 (issue 42), the config: every float key of the schema is a finite number
(item 2: model.norm_eps=inf and model.rope_theta=inf trained silently), and a key the chosen option
does not read is refused naming the option that reads it (item 9: tokenizer.file=my.json without
tokenizer=json trained with GPT-2)."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any, get_args, get_origin, get_type_hints

import pytest
import yaml
from helpers import REPO

from pretrain.config import ComponentConfig, Config, load_config, schema_rows, to_config
from pretrain.config.plugin_groups import BASES
from pretrain.errors import ConfigError

# --- item 2: every float key of the schema is checked finite ---------------------------------------

LEGITIMATE_INF: dict[str, str] = {}
"""Keys where inf is a meaningful value, with why. None: a key that may be unlimited says so with null
(train.grad_clip: no clipping; trainer.peak_tflops: looked up), so inf is always a mistake (and nan
always is)."""


def _dataclass_of(hint: Any) -> type | None:
    for candidate in (hint, *get_args(hint)):
        if isinstance(candidate, type) and is_dataclass(candidate):
            return candidate
    return None


def _is_float(hint: Any) -> bool:
    """float, float | None, list[float]."""
    if hint is float:
        return True
    return any(_is_float(arg) for arg in get_args(hint)) if get_origin(hint) is not dict else False


def _owners(key: str) -> list[type]:
    """The schema dataclasses that hold `key`; under a plug-in group, every plug-in's that has it."""
    *parents, name = key.split(".")
    classes: list[type] = [Config]
    for part in parents:
        found = [_dataclass_of(get_type_hints(cls).get(part)) for cls in classes]
        classes = []
        for child in filter(None, found):
            plugins = BASES[child].registry.config_classes().values() if child in BASES else ()
            classes += [child, *plugins]
    return [cls for cls in classes if name in get_type_hints(cls)]


PROBE = "0.5"
"""A valid value of every float key that is no key's default: an option that composes with it reads
the key (model.rope_theta=0.5 is refused under model.arch=gpt2, which has only the default)."""


def float_keys() -> list[tuple[str, str, list[str]]]:
    """(key, a valid value, group options) for every float key: docs/config.md's rows, whose owner
    types them float, then each mixture option's component floats (mixture.components.<name>.*)."""
    keys = []
    for key, default, _ in schema_rows():
        name = key.rsplit(".", 1)[-1]
        if any(_is_float(get_type_hints(cls)[name]) for cls in _owners(key)):
            items = default.strip("[]").split(",") if default.startswith("[") else None
            value = f"[{','.join([PROBE] * len(items))}]" if items else PROBE
            keys.append((key, value, []))
    hints = get_type_hints(ComponentConfig)
    component_floats = [f.name for f in fields(ComponentConfig) if _is_float(hints[f.name])]
    for option in sorted((REPO / "conf" / "mixture").glob("*.yaml")):
        for component in yaml.safe_load(option.read_text())["components"]:
            for name in component_floats:
                keys.append((f"mixture.components.{component}.{name}", PROBE, [f"mixture={option.stem}"]))
    return keys


def _composed(*overrides: str) -> Config:
    return to_config(load_config(list(overrides)))


def _reading(key: str, value: str, options: list[str]) -> list[str]:
    """Group options under which `key=value` composes (model.rope_theta: a llama size): the key is read."""
    group = key.split(".")[0]
    candidates = [options] + [
        [*options, f"{group}={p.stem}"] for p in sorted((REPO / "conf" / group).glob("*.yaml"))
    ]
    for candidate in candidates:
        try:
            _composed(*candidate, f"{key}={value}")
        except ConfigError:
            continue
        return candidate
    raise AssertionError(f"no option of {group} reads {key}={value}")


def _replace_first(value: str, bad: str) -> str:
    """`bad` for a scalar, or in place of a list's first item (train.betas=[inf,0.95])."""
    if value.startswith("["):
        items = value.strip("[]").split(",")
        return "[" + ",".join([bad, *items[1:]]) + "]"
    return bad


FLOAT_KEYS = float_keys()


def test_the_walk_finds_the_schemas_float_keys():
    found = {key for key, _, _ in FLOAT_KEYS}
    assert {"model.norm_eps", "model.rope_theta", "train.lr", "train.betas", "trainer.peak_tflops"} <= found
    assert "mixture.components.repo.weight" in found and "model.d_model" not in found


@pytest.mark.parametrize(("key", "value", "options"), FLOAT_KEYS, ids=[k for k, _, _ in FLOAT_KEYS])
def test_every_float_key_refuses_inf_and_nan_in_one_line_naming_it(key, value, options):
    reading = _reading(key, value, options)
    for bad in ("inf", "-inf", "nan"):
        given = _replace_first(value, bad)
        if key in LEGITIMATE_INF and bad == "inf":
            _composed(*reading, f"{key}={given}")
            continue
        with pytest.raises(ConfigError) as error:
            _composed(*reading, f"{key}={given}")
        line = str(error.value)
        assert "\n" not in line and line.startswith(key) and "Could not override" not in line, line


def test_inf_model_values_are_refused_with_a_finite_example():
    """The two that trained silently (every RMSNorm output 0; positions almost ignored)."""
    for key, default in (("model.norm_eps", "1e-05"), ("model.rope_theta", "10000.0")):
        with pytest.raises(
            ConfigError, match=rf"^{key}=inf must be a finite number \(e\.g\. {key}={default}\)$"
        ):
            _composed("model=llama-tiny", f"{key}=inf")
