"""The policy plug-ins: one registry, each policy's config types its own `data` option, and no
module outside data/policies/ names a policy."""

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
from pretrain.config import load_config, to_config
from pretrain.data.policies import REGISTRY, DataConfig, DataPolicy, Policy, policy_class
from pretrain.errors import ConfigError

PACKAGE = REPO / "src" / "pretrain"


def test_every_policy_is_registered_with_its_config_and_option():
    assert list(REGISTRY) == list(Policy)
    for name, cls in REGISTRY.items():
        assert issubclass(cls, DataPolicy) and cls.name == name
        assert issubclass(cls.config_class, DataConfig) and cls.config_class.for_policy == name
        option = yaml.safe_load((REPO / "conf" / "data" / f"{name}.yaml").read_text())
        assert option == {"defaults": [f"{name}_schema", "_self_"], "policy": name}
        config = to_config(load_config([f"data={name}"])).data
        assert type(config) is cls.config_class
        assert isinstance(cls(config), DataPolicy)


def test_each_config_holds_only_its_policys_options():
    options = {
        name: {f.name for f in fields(cls.config_class)} - {"policy", "max_seq_len", "long_docs"}
        for name, cls in REGISTRY.items()
    }
    assert options == {
        Policy.padded: {"pad_to"},
        Policy.prepacked: {"strategy", "document_mask", "positions", "packing_buffer"},
        Policy.bestfit: {"document_mask", "positions", "packing_buffer"},
        Policy.firstfit: {"document_mask", "positions", "packing_buffer", "open_bins"},
        Policy.vsl: {"curriculum", "curriculum_cycles"},
    }


def test_every_policy_has_the_composition_axes_with_todays_defaults():
    """data.long_docs for every policy (padded truncates, the others chunk); data.document_mask for
    every packing policy (on); vsl's pieces are isolated sequences, it has no mask to turn off."""
    for name in REGISTRY:
        config = to_config(load_config([f"data={name}"])).data
        assert config.long_docs == ("truncate" if name == Policy.padded else "chunk")
        unmasked = (Policy.padded, Policy.vsl)
        assert getattr(config, "document_mask", None) is (None if name in unmasked else True)


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
    with pytest.raises(
        ConfigError,
        match=r"^unknown data\.policy 'greedy'; choose one of padded, prepacked, bestfit, firstfit, vsl$",
    ):
        policy_class("greedy")


def _policy_literals(path) -> list[str]:
    names = set(map(str, Policy))
    tree = ast.parse(path.read_text())
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names]


def test_no_module_outside_the_policies_package_names_a_policy():
    """The data module, evaluation, stats, the CLI and the rest ask the registry or the policy object."""
    outside = [p for p in PACKAGE.rglob("*.py") if (PACKAGE / "data" / "policies") not in p.parents]
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
