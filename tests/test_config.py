"""The typed config: schema, one place for defaults, errors that name the key, one error family."""

from __future__ import annotations

import ast
import subprocess
from dataclasses import fields, is_dataclass
from typing import get_type_hints

import pytest
import yaml
from helpers import REPO, cli_env, prepare_command
from hydra.errors import ConfigCompositionException
from omegaconf import MISSING, OmegaConf

from pretrain import config as schema
from pretrain import errors
from pretrain.attention_backends import BACKENDS
from pretrain.config import GROUPS as TYPED
from pretrain.config import Config, MixtureConfig, load_config, to_config
from pretrain.data.batching.policies import REGISTRY, PackingConfig

# experiment and study_arm options are @package _global_ (tested by their own tests below)
GROUPS = sorted(
    p.name
    for p in (REPO / "conf").iterdir()
    if p.is_dir() and p.name not in ("hydra", "experiment", "study_arm")
)


def schema_classes(cls=Config):
    """Every dataclass of the schema, the root first, and each policy's options of the data group."""
    found = [cls]
    for hint in get_type_hints(cls).values():
        if isinstance(hint, type) and is_dataclass(hint):
            found += schema_classes(hint)
    if cls is Config:
        for typed in schema.GROUPS.values():
            found += list(typed.registry.config_classes().values())
    return found


def composition_error(*overrides: str) -> str:
    with pytest.raises(ConfigCompositionException) as info:
        load_config(list(overrides))
    return errors.describe(info.value)


def test_every_field_has_a_one_line_doc():
    for cls in schema_classes():
        docs = schema.field_docs(cls)
        for f in fields(cls):
            if is_dataclass(get_type_hints(cls)[f.name]):
                continue  # a group: documented by its own fields
            assert docs.get(f.name), f"{cls.__name__}.{f.name} has no docstring"
            assert "\n" not in docs[f.name]


def test_docs_config_md_is_generated_from_the_schema():
    generated = schema.markdown_reference()
    assert (REPO / "docs" / "config.md").read_text() == generated, (
        "run: python -m pretrain.config > docs/config.md"
    )
    keys = [row[0] for row in schema.schema_rows()]
    assert {"train.lr", "data.policy", "source.files", "model.max_seq_len", "ckpt_path"} <= set(keys)
    assert len(keys) == len(set(keys))


def test_group_files_never_repeat_a_schema_default():
    """Defaults live in the schema only: a group option sets the keys it chooses, nothing else."""
    defaults = OmegaConf.to_container(OmegaConf.structured(Config), resolve=False)
    for group in GROUPS:
        for path in sorted((REPO / "conf" / group).glob("*.yaml")):
            values = yaml.safe_load(path.read_text()) or {}
            if path.read_text().startswith("# @package _global_"):  # its group's keys under the group
                values = values.get(group) or {}
            schema = defaults[group]
            if group in TYPED:  # typed by the plug-in's own options, named first in its defaults list
                name = values[TYPED[group].key]
                assert values.pop("defaults") == [f"{name}_schema", "_self_"], path
                config_class = TYPED[group].schema_of(name)
                schema = OmegaConf.to_container(OmegaConf.structured(config_class), resolve=False)
            if group == "mixture":  # an optional group: null in the schema, typed by MixtureConfig
                schema = OmegaConf.to_container(OmegaConf.structured(MixtureConfig), resolve=False)
            for key, value in values.items():
                assert key in schema, f"{path}: {key} is not in the schema"
                default = schema[key]
                assert default == MISSING or default != value, (
                    f"{path}: {key}={value!r} repeats the schema default"
                )


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_option_composes_to_the_typed_config(group):
    for path in sorted((REPO / "conf" / group).glob("*.yaml")):
        config = to_config(load_config([f"{group}={path.stem}"]))
        assert isinstance(config, Config)
        node = getattr(config, group)
        assert all(not OmegaConf.is_missing(OmegaConf.structured(node), f.name) for f in fields(node))


@pytest.mark.parametrize("experiment", ["corrected", "minimind", "smoke"])
def test_experiments_compose(experiment):
    config = to_config(load_config([f"experiment={experiment}"]))
    assert config.experiment_name == experiment
    assert config.model.max_seq_len == config.data.max_seq_len  # the interpolation in the schema


STUDY_ARMS = {  # conf/study_arm/<arm>.yaml -> the data group it must select
    "padded": ("padded", {"pad_to": "max", "long_docs": "truncate"}),
    "padded_equal": ("padded", {"pad_to": "max", "long_docs": "truncate"}),
    "concat_nomask": ("prepacked", {"strategy": "concat", "document_mask": False}),
    "concat": ("prepacked", {"strategy": "concat", "document_mask": True}),
    "bfd": ("prepacked", {"strategy": "bfd", "document_mask": True}),
    "bestfit": ("bestfit", {"document_mask": True}),
    "firstfit": ("firstfit", {"document_mask": True}),
    "vsl": ("vsl", {"curriculum": "natural"}),
}


EQUALISED = {"padded_equal": {"batch_size": 12}}
"""Study arms that also set their rows per update, so their real tokens per update match the packed
arms' (conf/study_arm/padded_equal.yaml)."""


def test_the_composition_studys_arms_differ_only_in_the_data_layout():
    """Every arm of experiment=composition_study selects its layout and nothing else (an equalised arm
    its rows per update too): the same model, corpus, context and real-token budget; the sweep
    crosses all eight arms with three seeds."""
    assert sorted(p.stem for p in (REPO / "conf" / "study_arm").glob("*.yaml")) == sorted(STUDY_ARMS)
    shared = None
    for arm, (policy, options) in STUDY_ARMS.items():
        cfg = load_config(["experiment=composition_study", f"study_arm={arm}"])
        config = to_config(cfg)
        assert str(config.data.policy) == policy
        assert {key: getattr(config.data, key) for key in options} == options
        rest = OmegaConf.to_container(cfg, resolve=True)
        del rest["data"]
        for key, value in EQUALISED.get(arm, {}).items():
            assert rest["train"].pop(key) == value
        for key in EQUALISED.get(arm, {}):
            rest["train"][key] = 8  # every other arm's
        assert shared is None or rest == shared, arm
        shared = rest
    assert shared["train"]["max_tokens"] == 100_000 and shared["model"]["name"] == "tiny"
    sweep = OmegaConf.load(REPO / "conf" / "experiment" / "composition_study.yaml").hydra.sweeper.params
    assert sweep.seed == "0,1,2" and sorted(sweep.study_arm.split(",")) == sorted(STUDY_ARMS)


def test_wrong_type_names_the_key_and_the_type():
    message = composition_error("train.lr=abc")
    assert "train.lr=abc" in message and "could not be converted to Float" in message
    assert "train.max_steps" in composition_error("train.max_steps=1.5")
    assert "document_mask" in composition_error("data=prepacked", "data.document_mask=maybe")


def test_unknown_key_fails_at_composition():
    message = composition_error("train.learning_rate=0.1")
    assert "train.learning_rate" in message
    assert "model.n_layers" in composition_error("model.n_layers=3")


def test_the_data_group_holds_only_the_chosen_policys_options():
    """Each policy's dataclass types the group: another policy's option is an unknown key there."""
    padded = "no such key; data=padded has: policy, max_seq_len, long_docs, pad_to"
    assert "'data.pad_to': no such key; data=bestfit has: policy," in composition_error(
        "data=bestfit", "data.pad_to=longest"
    )
    assert f"'data.strategy': {padded}" in composition_error("data=padded", "data.strategy=bfd")
    assert f"'data.packing_buffer': {padded}" in composition_error("data=padded", "data.packing_buffer=8")
    for option, policy in REGISTRY.items():
        assert type(to_config(load_config([f"data={option}"])).data) is policy.config_class
    bestfit = to_config(load_config(["data=bestfit", "data.packing_buffer=8"])).data
    assert isinstance(bestfit, PackingConfig) and bestfit.packing_buffer == 8
    # Validation packs have their own buffer, the same for every policy (bestfit's is its training one).
    for option in ("prepacked", "firstfit"):
        assert "data.packing_buffer" in composition_error(f"data={option}", "data.packing_buffer=5")
    assert to_config(load_config(["train.eval_packing_buffer=5"])).train.eval_packing_buffer == 5


def test_data_errors_are_one_line_naming_the_key(tmp_path):
    with pytest.raises(errors.ConfigError) as info:
        to_config(load_config(["train.packing_buffer=8"]))
    assert str(info.value) == (
        "train.packing_buffer moved to the data group: set data.packing_buffer=8 instead "
        "(an option of data=bestfit)"
    )
    with pytest.raises(
        errors.ConfigError, match=r"^data\.policy=padded does not fit the options of data=bestfit"
    ):
        to_config(load_config(["data=bestfit", "data.policy=padded"]))
    with pytest.raises(errors.ConfigError, match=r"^data\.packing_buffer must be a positive integer, got 0$"):
        to_config(load_config(["data.packing_buffer=0"]))
    with pytest.raises(errors.ConfigError, match=r"^data\.max_seq_len must be an integer in 2\.\.4096"):
        to_config(load_config(["data.max_seq_len=4097"]))
    proc = subprocess.run(
        prepare_command("train.packing_buffer=8"),
        cwd=REPO,
        env=cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: train.packing_buffer moved")
    assert "set data.packing_buffer=8" in proc.stderr


def test_a_run_config_saved_before_the_data_group_split_is_upgraded():
    """A checkpoint's run_config from before: every policy's options in `data`, the buffer in `train`."""
    saved = OmegaConf.to_container(load_config(["data=bestfit"]), resolve=True, enum_to_str=True)
    saved["data"] = {"policy": "bestfit", "max_seq_len": 64, "pad_to": "max", "strategy": "concat",
                     "document_mask": True}  # fmt: skip
    saved["train"]["packing_buffer"] = 16
    upgraded = schema.upgrade_run_config(saved)
    assert upgraded["data"] == {"policy": "bestfit", "max_seq_len": 64, "packing_buffer": 16}
    assert "packing_buffer" not in upgraded["train"]
    root = OmegaConf.create(upgraded)
    assert to_config(root).data.packing_buffer == 16
    padded = to_config(schema.with_group_option(root, "data", "padded")).data
    assert (type(padded).__name__, padded.max_seq_len, padded.pad_to) == ("PaddedConfig", 64, "max")


def test_a_choice_outside_its_values_lists_them():
    message = composition_error("data.policy=greedy")
    assert message == f"data.policy=greedy: no such policy; choose one of {', '.join(REGISTRY)}"
    message = composition_error("attn.backend=flash")
    assert message == f"attn.backend=flash: no such backend; choose one of {', '.join(BACKENDS)}"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("split.validation_fraction=1.5", "split.validation_fraction"),
        ("budget.train_tokens=-1", "budget.train_tokens"),
        ("train.max_steps=0", "train.max_steps"),
        ("train.lr=0", "train.lr"),
        ("attn.compile=sometimes", "attn.compile"),
    ],
)
def test_range_checks_run_when_the_typed_config_is_built(override, message):
    cfg = load_config(["attn=flex", override] if override.startswith("attn.") else [override])
    with pytest.raises(errors.ConfigError, match=message.replace(".", r"\.")):
        to_config(cfg)


def test_to_config_gives_plain_typed_values():
    config = to_config(
        load_config(["data=padded", "data.max_seq_len=64", "source=local", "source.files=[a.parquet]"])
    )
    assert config.data.policy == "padded" and config.data.max_seq_len == 64 == config.model.max_seq_len
    assert config.source.files == ["a.parquet"] and isinstance(config.source.files, list)
    assert config.train.betas == [0.9, 0.95]
    assert to_config(config) is config


def test_error_family():
    for cls, builtin in [
        (errors.ConfigError, ValueError),
        (errors.CheckpointError, ValueError),
        (errors.SourceError, RuntimeError),
        (errors.TokenizerError, RuntimeError),
        (errors.CacheError, RuntimeError),
    ]:
        assert issubclass(cls, errors.PretrainError) and issubclass(cls, builtin)


def test_user_errors_exit_2_in_one_line_and_others_keep_their_traceback(capsys):
    with pytest.raises(SystemExit) as info, errors.exit_on_user_error():
        raise errors.CacheError("the cache at X is corrupt; rebuild it")
    assert info.value.code == 2
    assert capsys.readouterr().err == "error: the cache at X is corrupt; rebuild it\n"
    with pytest.raises(RuntimeError, match="CUDA error"), errors.exit_on_user_error():
        raise RuntimeError("CUDA error: device-side assert triggered")  # not ours: traceback kept
    with pytest.raises(ValueError, match="plain"), errors.exit_on_user_error():
        raise ValueError("plain")


def test_cli_bad_override_is_one_line_naming_the_key(tmp_path):
    proc = subprocess.run(
        prepare_command("train.lr=abc"),
        cwd=REPO,
        env=cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and "train.lr=abc" in line and "Float" in line


def test_data_model_and_stats_code_never_import_hydra_or_omegaconf():
    """Below the entry, code takes typed settings: no DictConfig reaches it."""
    package = REPO / "src" / "pretrain"
    for path in [*sorted((package / "data").rglob("*.py")), *sorted((package / "model").glob("*.py"))]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(("omegaconf", "hydra")), f"{path.name} imports {name}"
        assert "DictConfig" not in path.read_text(), path.name


def test_train_py_is_the_only_entry_and_registers_the_schema():
    text = (REPO / "train.py").read_text()
    assert "register_schema()" in text and "pretrain.training.run import train" in text
    assert not (REPO / "src" / "pretrain" / "training" / "cli.py").exists()


def test_the_paired_masking_study_differs_only_in_the_mask():
    """experiment=masking_paired: one factor (data.document_mask) on prepacked concat, 4 seeds, a
    decaying rate over a fixed number of updates (equal updates and tokens for both arms)."""
    configs = [
        OmegaConf.to_container(
            load_config(["experiment=masking_paired", f"data.document_mask={m}"]), resolve=True
        )
        for m in ("true", "false")
    ]
    assert [c["data"].pop("document_mask") for c in configs] == [True, False]
    assert configs[0] == configs[1]
    train = configs[0]["train"]
    assert (train["max_steps"], train["max_tokens"], train["min_lr_ratio"]) == (300, None, 0.1)
    assert train["val_every_n_steps"] == 100 and train["val_batches"] is None and train["warmup_steps"] > 0
    assert (configs[0]["data"]["policy"], configs[0]["data"]["strategy"]) == ("prepacked", "concat")
    sweep = OmegaConf.load(REPO / "conf" / "experiment" / "masking_paired.yaml").hydra.sweeper.params
    assert sweep.seed == "0,1,2,3" and sweep["data.document_mask"] == "true,false"
