"""W&B runs as a dashboard, checked on what W&B itself wrote offline (the run's `.wandb` record file,
read by tests/wandb_records.py): metrics against real tokens, the readable name and the group, the
inspect-data statistics in the config, the summary row and the plot, and `pretrain compare --wandb`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from wandb_records import OfflineRun, finished_run_file, run_file

from pretrain.cli import main
from pretrain.config import load_config, to_config
from pretrain.data.batching.policies import PolicySettings
from pretrain.data.ingest.cache import CacheSpec
from pretrain.data.ingest.prepare import prepare_cache
from pretrain.data.measures.stats import inspect_split
from pretrain.report.arm_render import WANDB_COLUMNS
from pretrain.report.compare import plot_run
from pretrain.report.contrast_render import CONTRAST_FIELDS
from pretrain.report.table import COLUMNS
from pretrain.report.wandb_log import run_group_of
from pretrain.training.loggers import (
    PLOT_KEY,
    TOKEN_AXIS,
    TokenAxisWandbLogger,
    build_loggers,
    flat_statistics,
    run_name,
)
from pretrain.training.run import train
from pretrain.training.run_record import Run, load_run

GROUP = "wandb-test"
POLICIES = {  # run directory -> overrides
    "bestfit": ["data=bestfit"],
    "concat": ["data=prepacked", "data.document_mask=false"],
}


def _overrides(out: Path, *extra: str) -> list[str]:
    return [
        "experiment=smoke",
        f"output_dir={out}",
        "progress_bar=false",
        "logger=wandb",
        f"experiment_name={GROUP}",
        "train.max_steps=4",
        *extra,
    ]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Two offline W&B runs of one group (bestfit; concat windows with cross-document attention) and
    an offline `pretrain compare --wandb` of both; yields the sweep directory."""
    root = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
            (root / name).mkdir()
            patch.setenv(name, str(root / name))
        patch.setenv("WANDB_MODE", "offline")
        patch.delenv("WANDB_API_KEY", raising=False)
        patch.setenv("PRETRAIN_CACHE_ROOT", str(root / "cache"))
        for directory, extra in POLICIES.items():
            train(load_config(_overrides(root / "sweep" / directory, *extra)), plot_run=plot_run)
        assert (
            main(["compare", str(root / "sweep"), "--output", str(root / "cmp" / "cmp.png"), "--wandb"]) == 0
        )
        yield root


def _run(sweep: Path, directory: str) -> OfflineRun:
    return OfflineRun(run_file(sweep / "sweep" / directory / "wandb"))


def _resolve_step_metric(run: OfflineRun, key: str) -> str | None:
    """The x axis W&B gives a logged key: its definition by name, else a matching glob. W&B takes
    *any* matching glob, so every glob that matches must name the same axis."""
    defined = {m.name: m.step_metric for m in run.metrics if m.name}
    if key in defined:
        return defined[key]
    globs = {m.glob_name: m.step_metric for m in run.metrics if m.glob_name}  # the last definition wins
    axes = {axis for glob, axis in globs.items() if key.startswith(glob.removesuffix("*"))}
    assert len(axes) <= 1, f"{key} matches globs with different axes: {axes}"
    return axes.pop() if axes else None


def test_every_train_and_val_metric_is_plotted_against_real_tokens(sweep):
    run = _run(sweep, "bestfit")
    logged = run.logged_keys()
    assert {"train/loss", "train/padding_waste", "val/loss", "lr", TOKEN_AXIS} <= logged
    ours = sorted(k for k in logged if k.startswith(("train/", "val/")) or k == "lr")
    for key in ours:
        if key != TOKEN_AXIS:
            assert _resolve_step_metric(run, key) == TOKEN_AXIS, key
    # The axis itself is defined by name (no glob can make it its own x axis); Lightning's step
    # counter is still logged and keeps its own definition.
    assert _resolve_step_metric(run, TOKEN_AXIS) == ""
    assert "trainer/global_step" in logged and _resolve_step_metric(run, "trainer/global_step") == ""
    # Every row with a metric carries the real tokens it was measured at (step_sync needs no help).
    assert all(TOKEN_AXIS in row for row in run.history if "train/loss" in row or "val/loss" in row)
    tokens = [row[TOKEN_AXIS] for row in run.history if TOKEN_AXIS in row]
    assert tokens == sorted(tokens) and tokens[0] > 0


def test_runs_have_readable_names_in_one_group(sweep):
    bestfit, concat = _run(sweep, "bestfit"), _run(sweep, "concat")
    assert (bestfit.name, concat.name) == ("bestfit-L128-bs4", "prepacked-L128-bs4")
    assert bestfit.group == concat.group == GROUP
    assert bestfit.config_value("data")["policy"] == "bestfit"  # W&B groups runs by `data.policy`


def test_run_name_spells_microbatch_tokens_and_accumulation():
    config = to_config(
        load_config(
            ["experiment=smoke", "data=padded", "train.batch_size=null", "train.microbatch_tokens=1024"]
            + ["train.accumulation=4"]
        )
    )
    assert run_name(config) == "padded-L128-mtok1024-acc4"


def _expected_statistics(sweep: Path, directory: str, audits: bool = False) -> dict:
    """inspect-data's statistics of that run's policy, computed here from its composed config."""
    config = to_config(load_config(_overrides(sweep / "unused", *POLICIES[directory])))
    policy = PolicySettings.from_config(config.data, config.train, config.seed)
    cache = prepare_cache(CacheSpec.from_config(config), progress=False)
    train, validation = cache.split("train"), cache.split("validation")
    return inspect_split(policy, train, validation, packs_dir=cache.packs_dir, audits=audits)


def test_config_holds_the_inspect_data_statistics_of_the_run(sweep, monkeypatch):
    monkeypatch.setenv("PRETRAIN_CACHE_ROOT", str(sweep / "cache"))
    for directory in POLICIES:
        run = _run(sweep, directory)
        stats = _expected_statistics(sweep, directory)
        expected = flat_statistics(stats)
        logged = {key: run.config_value(key) for key in run.config if key.startswith("data/")}
        assert set(logged) == set(expected)
        for key, value in expected.items():
            if isinstance(value, float):
                assert logged[key] == pytest.approx(value, rel=1e-12), key
            else:
                assert logged[key] == value, key
        # The flat keys, as documented: `data/<statistic>`, `data/<part>/<statistic>`.
        assert logged["data/steps_per_epoch"] == stats["steps_per_epoch"] > 0
        assert logged["data/chunk_lengths/median"] == stats["chunk_lengths"]["median"]
        assert logged["data/validation/documents"] == stats["validation"]["documents"] > 0
        # The costly audits are inspect-data's job, not every run's start: all else is the same.
        assert "data/verbatim_leaks" not in logged and "data/train_validation_overlap" not in logged
        full = _expected_statistics(sweep, directory, audits=True)
        assert {
            k: v
            for k, v in full.items()
            if k not in ("verbatim_leaks", "verbatim_leak_ids", "train_validation_overlap")
        } == stats
        assert full["train_validation_overlap"] == 0
    bestfit, concat = _run(sweep, "bestfit"), _run(sweep, "concat")
    assert bestfit.config_value("data/cross_document_visible_fraction") == 0.0
    assert concat.config_value("data/cross_document_visible_fraction") > 0.0
    assert bestfit.config_value("data/padding_waste") == 0.0
    assert bestfit.config_value("data/policy") == "bestfit"
    # The composition audit is in the config; the per-step attention cost in the history.
    from pretrain.data.measures.audit import AUDIT_KEYS

    for key in AUDIT_KEYS:
        assert bestfit.config_value(f"data/{key}") is not None, key
    assert bestfit.config_value("data/fragmented_documents") > 0.0  # smoke's long documents are chunked
    # The mask off: one segment per pack, so attention costs more per token than chunk by chunk.
    assert concat.config_value("data/attention_cost") > bestfit.config_value("data/attention_cost")
    costs = [row["train/attention_cost"] for row in concat.history if "train/attention_cost" in row]
    assert len(costs) == 4 and min(costs) > 0


def test_summary_row_and_comparison_plot_at_the_end(sweep):
    for directory in POLICIES:
        run = _run(sweep, directory)
        result = json.loads((sweep / "sweep" / directory / "run.json").read_text())
        summary = run.summary
        assert summary["summary/steps"] == result["steps"] == 4
        assert summary["summary/real_tokens"] == result["tokens"] > 0
        assert summary["summary/train_loss"] == pytest.approx(result["metrics"]["train/loss"])
        assert summary["summary/val_loss"] == pytest.approx(result["metrics"]["val/loss"])
        assert summary["summary/seconds"] > 0 and summary["summary/tokens_per_sec"] > 0
        numbers = load_run(sweep / "sweep" / directory)  # the row of `pretrain compare`'s table
        assert summary["summary/padding_waste"] == pytest.approx(numbers.mean("train/padding_waste"))
        assert 0.0 < summary["summary/pack_utilization"] <= 1.0
        assert summary["summary/attention_cost"] == pytest.approx(numbers.mean("train/attention_cost"))
        composition = result["composition"]
        assert summary["summary/fragmented_documents"] == composition["fragmented_documents"]
        assert summary["summary/cross_document_visible"] == composition["cross_document_visible_fraction"]
        floors = result["floors"]  # measures/floors.py: the run's cache's, in run.json and the summary row
        assert floors["bigram"]["method"] == "jelinek-mercer" and floors["sample"] is None
        for model in ("unigram", "bigram"):
            assert summary[f"summary/floor/{model}_nats"] == pytest.approx(floors[model]["nats"], rel=1e-12)
            assert summary[f"summary/floor/{model}_bits_per_byte"] == pytest.approx(
                floors[model]["bits_per_byte"], rel=1e-12
            )
        image = summary[PLOT_KEY]
        assert image["_type"] == "image-file" and image["format"] == "png"
        png = run.path.parent / "files" / image["path"]
        assert png.read_bytes()[:4] == b"\x89PNG"
        assert [m for m in run.records if m.WhichOneof("record_type") == "exit"]  # finished cleanly


def test_compare_logs_the_table_and_plot_into_one_run_of_the_group(sweep):
    run = OfflineRun(finished_run_file(sweep / "cmp" / "wandb"))
    assert (run.name, run.group, run.job_type) == (f"compare-{GROUP}", GROUP, "compare")
    (row,) = [row for row in run.history if "compare/table" in row]
    table = row["compare/table"]
    assert table["_type"] == "table-file" and table["nrows"] == 2 and table["ncols"] == len(COLUMNS)
    content = json.loads((run.path.parent / "files" / table["path"]).read_text())
    assert content["columns"] == list(COLUMNS)
    by_policy = {r[COLUMNS.index("policy")]: dict(zip(COLUMNS, r, strict=True)) for r in content["data"]}
    assert set(by_policy) == {"bestfit", "prepacked"}
    for directory, policy in (("bestfit", "bestfit"), ("concat", "prepacked")):
        cells, source = by_policy[policy], load_run(sweep / "sweep" / directory)
        for column in ("real tokens", "train loss", "val loss", "tokens/s", "padding waste", "pack util"):
            assert isinstance(cells[column], int | float) and math.isfinite(cells[column]), column
        assert cells["real tokens"] == source.last("train/tokens")
        assert cells["train loss"] == pytest.approx(source.last("train/loss"))
        assert cells["padding waste"] == pytest.approx(source.mean("train/padding_waste"))
        assert (cells["max_seq_len"], cells["batch"]) == (128, 4)
        # The composition arms told apart: run.json's audit and the mean per-step attention cost.
        audit = json.loads((sweep / "sweep" / directory / "run.json").read_text())["composition"]
        assert cells["fragmented docs"] == audit["fragmented_documents"]
        assert cells["x-doc visible"] == audit["cross_document_visible_fraction"]
        assert cells["attn cost"] == pytest.approx(source.mean("train/attention_cost"))
    assert by_policy["prepacked"]["x-doc visible"] > 0.0 == by_policy["bestfit"]["x-doc visible"]
    assert row[PLOT_KEY]["_type"] == "image-file"
    assert (sweep / "cmp" / "cmp.md").read_text().split("## runs\n\n")[1].count("\n") == 4  # markdown too
    # The arms' table (one seed per arm here): one row per metric and arm, numbers as numbers.
    arms = json.loads((run.path.parent / "files" / row["compare/arms"]["path"]).read_text())
    assert arms["columns"] == list(WANDB_COLUMNS)
    cells = [dict(zip(WANDB_COLUMNS, r, strict=True)) for r in arms["data"]]
    # 11 metrics, and the context gain with the loss from the previous token alone (eval.context)
    assert len(cells) == 13 * 2 and {c["arm"] for c in cells} == {"bestfit", "prepacked document_mask=false"}
    gain = {c["arm"]: c["mean"] for c in cells if c["metric"].startswith("context gain")}
    assert gain["bestfit"] == pytest.approx(load_run(sweep / "sweep" / "bestfit").last("val/context_gain"))
    (final,) = [c for c in cells if c["metric"] == "final train loss" and c["arm"] == "bestfit"]
    assert final["n"] == 1 and final["mean"] == pytest.approx(
        load_run(sweep / "sweep" / "bestfit").last("train/loss")
    )
    assert final["std"] is None and final["diff"] is None  # the reference (first arm), one seed
    # The contrasts (data.policy varies: one cell, bestfit the first level), as compare.json has them.
    logged = json.loads((run.path.parent / "files" / row["compare/contrasts"]["path"]).read_text())
    assert logged["columns"] == list(CONTRAST_FIELDS)
    contrasts = [dict(zip(CONTRAST_FIELDS, r, strict=True)) for r in logged["data"]]
    (val,) = [c for c in contrasts if c["metric"] == "val_loss"]
    assert (val["level"], val["reference"], val["setting"], val["test"]) == (
        "prepacked document_mask=false",
        "bestfit",
        "all runs",
        "n<2",
    )
    losses = {name: load_run(sweep / "sweep" / name).last("val/loss") for name in ("bestfit", "concat")}
    assert val["diff"] == pytest.approx(losses["concat"] - losses["bestfit"])
    written = json.loads((sweep / "cmp" / "cmp.json").read_text())["contrasts"]
    assert [c["diff"] for c in written] == [c["diff"] for c in contrasts]


def _job(tmp_path: Path, hydra: dict | None, **config) -> Run:
    path = tmp_path / "job"
    if hydra is not None:
        (path / ".hydra").mkdir(parents=True, exist_ok=True)
        (path / ".hydra" / "hydra.yaml").write_text(json.dumps({"hydra": hydra}))  # JSON is YAML
    return Run(path, "label", "bestfit", 128, 4, {}, config={"experiment_name": "exp", **config})


def test_compare_finds_the_group_the_runs_logged_to(tmp_path):
    job = "/work/multirun/2026-11-30/10-00-00/3"
    default = {  # hydra.yaml is saved unresolved: the default sweep dir still reads ${now:...}
        "mode": "MULTIRUN",
        "sweep": {"dir": "multirun/${now:%Y-%m-%d}/${now:%H-%M-%S}", "subdir": "${hydra.job.num}"},
        "runtime": {"output_dir": job},
    }
    assert run_group_of(_job(tmp_path, default)) == "multirun/2026-11-30/10-00-00"
    explicit = {**default, "sweep": {"dir": "outputs/multirun/mine", "subdir": "${hydra.job.num}"}}
    assert run_group_of(_job(tmp_path, explicit)) == "outputs/multirun/mine"
    short = {**default, "sweep": {"dir": "mine", "subdir": "${hydra.job.num}"}}
    assert run_group_of(_job(tmp_path, short)) == "mine"
    assert run_group_of(_job(tmp_path, default, logger={"group": "chosen"})) == "chosen"
    single = {"mode": "RUN", "runtime": {"output_dir": job}}
    assert run_group_of(_job(tmp_path, single)) == "exp"
    assert run_group_of(_job(tmp_path, None)) == "exp"


def test_the_wandb_logger_starts_without_the_anonymous_setting_warning(tmp_path, monkeypatch, capfd):
    """Lightning passes `anonymous=None` to wandb.init, and W&B warns it "has no effect": not passed."""
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name))
    monkeypatch.setenv("WANDB_MODE", "offline")
    config = to_config(load_config(["experiment=smoke", "logger=wandb", f"output_dir={tmp_path / 'run'}"]))
    (logger,) = [lg for lg in build_loggers(config, tmp_path / "run") if isinstance(lg, TokenAxisWandbLogger)]
    assert "anonymous" not in logger._wandb_init
    try:
        assert logger.experiment.name == run_name(config)
    finally:
        logger.experiment.finish()
    captured = capfd.readouterr()
    assert "anonymous" not in captured.out + captured.err


def test_lm_eval_scores_join_the_training_runs_own_wandb_summary(sweep, monkeypatch, tmp_path):
    """`pretrain lm-eval` resumes the training run by its id: its summary gains downstream/<task>/<metric>."""
    import shutil

    from pretrain.downstream.wandb_record import log_downstream, wandb_run_id

    trained = _run(sweep, "concat")
    run_dir = tmp_path / "concat"  # a copy: the other tests read the sweep's one offline run per folder
    shutil.copytree(sweep / "sweep" / "concat", run_dir, ignore=shutil.ignore_patterns("checkpoints"))
    assert wandb_run_id(run_dir) == trained.runs[0].run_id
    monkeypatch.setenv("WANDB_MODE", "offline")
    metrics = {"pretrain_recall": {"acc": 0.25, "loglikelihood_difference": -0.5, "bad": math.nan}}
    where = Path(log_downstream(run_dir, metrics))
    assert where.parent == run_dir / "wandb" and where.name.endswith(trained.runs[0].run_id)
    scored = OfflineRun(finished_run_file(where))
    assert scored.runs[0].run_id == trained.runs[0].run_id
    assert scored.summary["downstream/pretrain_recall/acc"] == 0.25
    assert scored.summary["downstream/pretrain_recall/loglikelihood_difference"] == -0.5
    assert "downstream/pretrain_recall/bad" not in scored.summary  # nan is no score
    assert log_downstream(sweep / "cmp", metrics) is None  # not a training run's directory
