"""The plug-ins (data policies, attention backends, source kinds): one registry each, each plug-in's
config types its own option, and no module outside data/batching/policies/ names a policy. Every case here is
derived from the registries: a new plug-in is covered without editing this file."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import fields

import pytest
import yaml
from helpers import REPO

from pretrain import errors
from pretrain.config import GROUPS, load_config, to_config
from pretrain.data.batching.policies import REGISTRY, DataConfig, DataPolicy, PackingConfig, policy_class
from pretrain.errors import ConfigError

PACKAGE = REPO / "src" / "pretrain"


PLUGINS = [(group, name) for group, typed in GROUPS.items() for name in typed.registry]


@pytest.mark.parametrize(("group", "name"), PLUGINS)
def test_every_plugin_has_its_option_typed_by_its_config(group, name):
    """conf/<group>/<name>.yaml lists `<name>_schema` first and chooses the plug-in, nothing else;
    composing it types the group by the plug-in's dataclass, and each test variant composes."""
    typed = GROUPS[group]
    option = yaml.safe_load((REPO / "conf" / group / f"{name}.yaml").read_text())
    assert option["defaults"] == [f"{name}_schema", "_self_"] and option[typed.key] == name
    plugin = typed.registry[name]
    assert issubclass(plugin.config_class, typed.base)
    config = getattr(to_config(load_config([f"{group}={name}"])), group)
    assert type(config) is plugin.config_class and getattr(config, typed.key) == name
    for case, (chosen, *overrides) in typed.registry.variants().items():
        if chosen == name:
            assert case and type(
                getattr(to_config(load_config([f"{group}={name}", *overrides])), group)
            ) is type(config)


@pytest.mark.parametrize("group", list(GROUPS))
def test_the_choices_are_the_registry(group):
    """Every option file of a plug-in group is a registered plug-in, and the reverse."""
    options = {p.stem for p in (REPO / "conf" / group).glob("*.yaml")}
    assert options == set(GROUPS[group].registry)


@pytest.mark.parametrize("group", list(GROUPS))
def test_another_plugins_option_is_refused_at_composition(group):
    """An option of one plug-in is an unknown key under another (named with the keys it has)."""
    typed = GROUPS[group]
    classes = typed.registry.config_classes()
    keys = {name: {f.name for f in fields(cls)} for name, cls in classes.items()}
    for name, own in keys.items():
        foreign = sorted(set().union(*keys.values()) - own)
        if foreign:
            with pytest.raises(
                ConfigError, match=rf"Could not override '{group}\.{foreign[0]}': no such key"
            ):
                load_config([f"{group}={name}", f"{group}.{foreign[0]}=1"])


def test_every_policy_is_registered_with_its_config_and_option():
    for name, cls in REGISTRY.items():
        assert issubclass(cls, DataPolicy) and cls.name == name
        assert issubclass(cls.config_class, DataConfig) and cls.config_class.for_policy == name
        option = yaml.safe_load((REPO / "conf" / "data" / f"{name}.yaml").read_text())
        assert option == {"defaults": [f"{name}_schema", "_self_"], "policy": name}
        config = to_config(load_config([f"data={name}"])).data
        assert type(config) is cls.config_class
        assert isinstance(cls(config), DataPolicy)


def test_every_policy_has_the_composition_axes_with_todays_defaults():
    """data.long_docs for every policy (the baseline truncates, the others chunk); data.document_mask
    on for every packing policy (a policy of isolated sequences has no mask to turn off)."""
    for name, cls in REGISTRY.items():
        config = to_config(load_config([f"data={name}"])).data
        assert config.long_docs == ("truncate" if cls.baseline else "chunk")
        if issubclass(cls.config_class, PackingConfig):
            assert config.document_mask is True


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data=firstfit", "data.open_bins=0"], r"data\.open_bins must be a positive integer, got 0"),
        (["data=firstfit", "data.open_bins=-2"], r"data\.open_bins must be a positive integer, got -2"),
        (["data=padded", "data.document_mask=false"], r"Could not override 'data\.document_mask'"),
        (["data=bestfit", "data.open_bins=4"], r"Could not override 'data\.open_bins'"),
        (["data=bestfit", "data.long_docs=foo"], r"Invalid value 'foo', expected one of \[chunk, truncate\]"),
        (["data=vsl", "data.document_mask=false"], r"Could not override 'data\.document_mask'"),
        (
            ["data=vsl", "data.curriculum=grow"],
            r"Invalid value 'grow', expected one of \[natural, grow_p2, uniform\]",
        ),
        (
            ["data=vsl", "data.curriculum_cycles=0"],
            r"data\.curriculum_cycles must be a positive integer, got 0",
        ),
        (
            ["data=vsl", "data.max_seq_len=1000"],
            r"^data=vsl cuts documents into power-of-two pieces: data\.max_seq_len must be a power of two, "
            r"got 1000; set e\.g\. data\.max_seq_len=1024$",
        ),
        (
            ["data=vsl", "train.batch_size=null", "train.microbatch_tokens=1000"],
            r"^data=vsl serves the same tokens at every sequence length: train\.microbatch_tokens=1000 must "
            r"be a multiple of data\.max_seq_len=512; set e\.g\. train\.microbatch_tokens=512$",
        ),
    ],
)
def test_a_composition_option_it_cannot_take_is_refused(overrides, message):
    """What the CLI prints after `error:` (errors.describe) names the key and the fix."""
    with pytest.raises(Exception) as raised:
        to_config(load_config(overrides))
    assert re.search(message, errors.describe(raised.value))


def test_an_unknown_policy_is_refused_listing_the_choices():
    with pytest.raises(ConfigError) as refused:
        policy_class("greedy")
    assert str(refused.value) == f"unknown data.policy 'greedy'; choose one of {', '.join(REGISTRY)}"


def _policy_literals(path) -> list[str]:
    names = set(REGISTRY)
    tree = ast.parse(path.read_text())
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names]


def test_no_module_outside_the_policies_package_names_a_policy():
    """The data module, evaluation, stats, the CLI and the rest ask the registry or the policy object
    (config/migrate.py, the one home of old keys, names the policies whose old configs it reads)."""
    migrate = PACKAGE / "config" / "migrate.py"
    policies = PACKAGE / "data" / "batching" / "policies"
    outside = [p for p in PACKAGE.rglob("*.py") if policies not in p.parents and p != migrate]
    assert len(outside) > 20
    named = {str(p.relative_to(PACKAGE)): _policy_literals(p) for p in outside}
    assert {path: found for path, found in named.items() if found} == {}


def test_the_config_schema_imports_the_policies_without_torch():
    """The policy modules build batches lazily, so `pretrain prepare` (which composes the config)
    never pays for importing torch."""
    code = "import sys, pretrain.config; print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert proc.stdout.strip() == "[]"
