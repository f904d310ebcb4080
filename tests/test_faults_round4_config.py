"""Reliability, round 4 (issue 42), the config: every float key of the schema is a finite number
(item 2: model.norm_eps=inf and model.rope_theta=inf trained silently), and a key the chosen option
does not read is refused naming the option that reads it (item 9: tokenizer.file=my.json without
tokenizer=json trained with GPT-2)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields, is_dataclass
from typing import Any, get_args, get_origin, get_type_hints

import pytest
import yaml
from helpers import REPO

from pretrain.config import GROUPS, ComponentConfig, Config, load_config, schema_rows, to_config
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


# --- item 9: a key the chosen option does not read is refused naming the options that read it -----


def _plugin_cases() -> list[tuple[str, str, str, list[str]]]:
    """(group, chosen plug-in, key, the plug-ins that read it) for every key of a plug-in group that
    the chosen plug-in does not have and another does, from the registries."""
    cases = []
    for group, typed in GROUPS.items():
        keys = {name: {f.name for f in fields(cls)} for name, cls in typed.registry.config_classes().items()}
        for chosen, own in keys.items():
            for key in sorted(set().union(*keys.values()) - own):
                cases.append((group, chosen, key, [name for name, has in keys.items() if key in has]))
    return cases


PLUGIN_CASES = _plugin_cases()


def test_every_plugin_groups_foreign_keys_are_found():
    found = {(group, chosen, key) for group, chosen, key, _ in PLUGIN_CASES}
    assert {
        ("data", "padded", "packing_buffer"),
        ("source", "pydocs", "files"),
        ("attn", "sdpa", "compile"),
    } <= found


@pytest.mark.parametrize("case", PLUGIN_CASES, ids=["{}={} {}".format(*c[:3]) for c in PLUGIN_CASES])
def test_a_key_of_another_plugin_names_the_plugins_that_read_it(case):
    """Both spellings: `group.key=...` (Hydra's could-not-override) and `+group.key=...`."""
    group, chosen, key, readers = case
    named = ", ".join(f"{group}={name}" for name in readers)
    for override in (f"{group}.{key}=1", f"+{group}.{key}=1"):
        with pytest.raises(ConfigError) as error:
            load_config([f"{group}={chosen}", override])
        line = str(error.value)
        assert "\n" not in line and f"{group}.{key}" in line, line
        assert line.endswith(
            f"; read by {named}: choose {'it' if len(readers) == 1 else 'one'}, or drop the key"
        )


def test_a_mixture_components_source_key_names_the_kind_that_reads_it():
    with pytest.raises(ConfigError) as error:
        _composed("mixture=pydocs_repo", "+mixture.components.pydocs.source.path=x")
    assert str(error.value).endswith(
        "; read by source=pkgdocs, source=fineweb, source=chat: choose one, or drop the key"
    )


def _read_by_cases() -> list[tuple[str, str, str, str, tuple[str, ...]]]:
    """(group, chooser, choice, key, the choices that read it) for every key a group declares read
    only under some choices (its class's `read_by`), under each choice that does not read it."""
    cases = []
    hints = get_type_hints(Config)
    for f in fields(Config):
        cls = _dataclass_of(hints[f.name])
        read_by = getattr(cls, "read_by", None)
        if read_by is None:
            continue
        choices = [str(c) for c in get_type_hints(cls)[read_by.chooser]]  # an enum: its members
        for key, readers in read_by.keys.items():
            cases += [
                (f.name, read_by.chooser, choice, key, readers) for choice in choices if choice not in readers
            ]
    return cases


READ_BY_CASES = _read_by_cases()


def test_the_declared_cases_cover_the_tokenizer_keys_of_the_issue():
    found = {(group, choice, key) for group, _, choice, key, _ in READ_BY_CASES}
    assert {
        ("tokenizer", "bundled", "file"),
        ("tokenizer", "bundled", "vocab_file"),
        ("tokenizer", "bundled", "merges_file"),
        ("tokenizer", "bundled", "eos_token"),
        ("tokenizer", "file", "vocab_file"),
    } <= found


@pytest.mark.parametrize("case", READ_BY_CASES, ids=["{}.{}={} {}".format(*c[:4]) for c in READ_BY_CASES])
def test_a_key_its_choice_does_not_read_is_refused_naming_the_choices_that_do(case):
    group, chooser, choice, key, readers = case
    with pytest.raises(ConfigError) as error:
        _composed(f"{group}.{chooser}={choice}", f"{group}.{key}=my.json")
    line = str(error.value)
    assert "\n" not in line and line.startswith(
        f"{group}.{key}='my.json': {group}.{chooser}={choice} does not"
    ), line
    assert all(f"{group}.{chooser}={reader}" in line for reader in readers), line
    for reader in readers:  # read there: accepted
        _composed(f"{group}.{chooser}={reader}", f"{group}.{key}=my.json")


def test_tokenizer_file_without_tokenizer_json_is_refused_before_any_run_directory(tmp_path):
    """The issue's case: it trained with GPT-2 and ignored the file."""
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "train.py", "tokenizer.file=my.json", f"hydra.run.dir={run}"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0] == (
        "error: tokenizer.file='my.json': tokenizer.source=bundled does not read it; read by tokenizer=json "
        "(tokenizer.source=file): choose it, or drop the key"
    )
    assert not run.exists()
