"""The project's lm-evaluation-harness tasks (downstream/task_files.py): what each example holds, read
back from the document texts independently, and the same bytes for one seed. No model runs here:
tests/test_lm_eval.py runs the harness on a trained checkpoint (e2e tier)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys

import numpy as np
import pytest
from helpers.texts import make_texts
from scipy import stats

from pretrain.data.ingest.tokenizer import EOS_TEXT, build_tokenizer, bundled_files, token_byte_lengths
from pretrain.data.tokens import TokenSplit
from pretrain.downstream.harness import downstream_metrics, flat_results, recall_contrast
from pretrain.downstream.task_files import (
    BPB,
    CLOZE,
    CUE_WORDS,
    FUNCTION_WORDS,
    RECALL,
    RECALL_CUE_ONLY,
    RECALL_DISTRACTOR,
    RECALL_PLAIN,
    TaskSource,
    write_task_files,
)
from pretrain.errors import ConfigError

MAX_SEQ_LEN = 128


@pytest.fixture(scope="module")
def source() -> TaskSource:
    """A validation split of English-like documents (one long), encoded with GPT-2 as the cache is."""
    files = bundled_files()
    tokenizer = build_tokenizer(files)
    eos = tokenizer.token_to_id(EOS_TEXT)
    texts = make_texts(30, seed=7, long_every=12)
    documents = [[*tokenizer.encode(text, add_special_tokens=False).ids, eos] for text in texts]
    lengths = np.array([len(d) for d in documents], dtype=np.int64)
    tokens = np.concatenate([np.array(d, dtype=np.uint16) for d in documents])
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    split = TokenSplit(tokens=tokens, offsets=offsets, lengths=lengths, ids=[f"doc{i}" for i in range(30)])
    return TaskSource(split, tokenizer, EOS_TEXT, token_byte_lengths(files, 50257), MAX_SEQ_LEN, seed=3)


@pytest.fixture(scope="module")
def written(source, tmp_path_factory):
    files = write_task_files(tmp_path_factory.mktemp("tasks"), source, count=200)
    rows = {
        task: [json.loads(line) for line in (files.directory / f"{task}.jsonl").read_text().splitlines()]
        for task in (CLOZE, RECALL_PLAIN, RECALL_DISTRACTOR, RECALL_CUE_ONLY, BPB)
    }
    return files, rows


def _text(source: TaskSource, document: str) -> str:
    index = int(document.removeprefix("doc"))
    return source.tokenizer.decode(source.split.document(index)[:-1].tolist())


def test_task_files_are_the_same_bytes_for_one_seed_and_differ_for_another(source, tmp_path):
    first = write_task_files(tmp_path / "a", source, count=200)
    second = write_task_files(tmp_path / "b", source, count=200)
    names = sorted(p.name for p in first.directory.iterdir())
    assert names == sorted(p.name for p in second.directory.iterdir())
    assert {
        f"{t}.yaml" for t in (CLOZE, RECALL, RECALL_PLAIN, RECALL_DISTRACTOR, RECALL_CUE_ONLY, BPB)
    } <= set(names)
    for name in names:
        assert (first.directory / name).read_bytes() == (second.directory / name).read_bytes(), name
    other = write_task_files(tmp_path / "c", source.__class__(**{**source.__dict__, "seed": 4}), count=200)
    for task in (CLOZE, RECALL_PLAIN):
        assert (other.directory / f"{task}.jsonl").read_bytes() != (
            first.directory / f"{task}.jsonl"
        ).read_bytes()
    # bpb is every chunk of the first documents: no draw, the same for every seed
    assert (other.directory / f"{BPB}.jsonl").read_bytes() == (first.directory / f"{BPB}.jsonl").read_bytes()


def test_a_cloze_example_is_a_passage_and_its_next_word(source, written):
    _, rows = written
    assert len(rows[CLOZE]) >= 50
    encode = source.tokenizer.encode
    for row in rows[CLOZE]:
        text = _text(source, row["document"])
        assert row["context"] + row["continuation"] in text  # the passage and its word, as written
        word = row["continuation"]
        assert word.startswith(" ") and word[1:].isalpha() and len(word) >= 4
        assert word[1:].lower() not in FUNCTION_WORDS  # a context-free guess would get it
        assert len(row["context"].split()) >= 16
        assert len(encode(row["context"] + word, add_special_tokens=False).ids) <= MAX_SEQ_LEN


def test_a_recall_answer_is_what_followed_its_cue_in_the_same_passage(source, written):
    _, rows = written
    plain, distracted, alone = rows[RECALL_PLAIN], rows[RECALL_DISTRACTOR], rows[RECALL_CUE_ONLY]
    assert len(plain) == len(distracted) == len(alone) >= 50
    encode = source.tokenizer.encode
    for one, two, three in zip(plain, distracted, alone, strict=True):
        passage, cue = one["context"].rsplit("\n", 1)
        assert len(cue.split()) == CUE_WORDS and passage.count(cue) == 1
        assert passage.index(cue + one["continuation"]) >= 0  # the answer followed the cue there
        assert one["continuation"][1:].lower() not in FUNCTION_WORDS
        assert passage in _text(source, one["document"])
        # the same prompt and answer, after another document's passage and the EOS
        assert two["document"] == one["document"] and two["continuation"] == one["continuation"]
        before, after = two["context"].split(EOS_TEXT)
        assert after == one["context"] and cue not in before
        assert two["distractor_document"] != int(one["document"].removeprefix("doc"))
        assert three == {**one, "context": cue}  # the control: the cue without its passage
        assert before in _text(source, f"doc{two['distractor_document']}")
        assert len(encode(two["context"] + two["continuation"], add_special_tokens=False).ids) <= MAX_SEQ_LEN


def test_bpb_requests_are_the_projects_chunks_with_their_documents_bytes(source, written):
    files, rows = written
    encode = source.tokenizer.encode
    assert files.bpb_documents == sorted(set(files.bpb_documents)) and len(rows[BPB]) >= 100
    split = source.split
    for index in files.bpb_documents:
        mine = [row for row in rows[BPB] if row["document"] == f"doc{index}"]
        tokens = split.document(index).tolist()
        # chunk k holds inputs tokens[k*L : k*L + L] and their targets: L + 1 tokens from its start
        for k, row in enumerate(mine):
            ids = encode(row["context"] + row["continuation"], add_special_tokens=False).ids
            assert ids == tokens[k * MAX_SEQ_LEN : (k + 1) * MAX_SEQ_LEN + 1]
            assert row["context"] == row["context"].rstrip() and row["targets"] == len(ids) - 1
        assert sum(row["targets"] for row in mine) == len(tokens) - 1  # every pair of it, once
        text = _text(source, f"doc{index}")
        assert sum(row["bytes"] for row in mine) == len(text.encode("utf-8"))
    assert files.bpb_left_out + len(files.bpb_documents) == max(files.bpb_documents) + 1


def test_utils_reads_the_examples_beside_it_and_sums_bits_per_byte(written):
    files, rows = written
    spec = importlib.util.spec_from_file_location("generated_utils", files.directory / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    source = (files.directory / "utils.py").read_text()
    assert "from pretrain" not in source and "import pretrain" not in source  # runs where pretrain is not
    dataset = utils.load(data_file=f"{CLOZE}.jsonl", max_seq_lengths=[1])
    assert list(dataset) == ["test"] and dataset["test"].to_list() == rows[CLOZE]
    assert utils.bits_per_byte({"bytes": 7}, [(-2.5, False)]) == {"bits_per_byte": (-2.5, 7)}


def _sample(doc_id: int, loglikelihood: float, greedy: bool) -> dict:
    return {"doc_id": doc_id, "filtered_resps": [(loglikelihood, greedy)]}


def test_recall_contrast_pairs_examples_by_id_with_a_t_interval():
    rng = np.random.default_rng(0)
    plain_ll, other_ll, alone_ll = rng.normal(-3, 1, 40), rng.normal(-3.4, 1, 40), rng.normal(-5, 1, 40)
    plain_hit, other_hit = rng.random(40) < 0.5, rng.random(40) < 0.3
    samples = {
        RECALL_PLAIN: [_sample(i, plain_ll[i], plain_hit[i]) for i in range(40)],
        # another order and one extra example: pairing is by doc_id, the unpaired one is left out
        RECALL_DISTRACTOR: [_sample(i, other_ll[i], other_hit[i]) for i in reversed(range(40))]
        + [_sample(99, 0.0, True)],
        RECALL_CUE_ONLY: [_sample(i, alone_ll[i], False) for i in range(40)],
    }
    out = recall_contrast(samples)
    assert out["examples"] == 40
    difference = other_ll - plain_ll
    assert out["loglikelihood_difference"] == pytest.approx(difference.mean(), abs=1e-12)
    low, high = stats.ttest_1samp(difference, 0).confidence_interval(0.95)
    assert (out["loglikelihood_difference_low"], out["loglikelihood_difference_high"]) == pytest.approx(
        (low, high)
    )
    assert out["acc"] == pytest.approx(plain_hit.mean()) and out["acc_distractor"] == pytest.approx(
        other_hit.mean()
    )
    gain = plain_ll - alone_ll  # what the passage gives: plain - cue only
    assert out["loglikelihood_passage_gain"] == pytest.approx(gain.mean(), abs=1e-12)
    low, high = stats.ttest_1samp(gain, 0).confidence_interval(0.95)
    assert (out["loglikelihood_passage_gain_low"], out["loglikelihood_passage_gain_high"]) == pytest.approx(
        (low, high)
    )
    assert out["acc_cue_only"] == 0.0


def test_flat_results_name_metrics_without_their_filter_and_keep_stderrs():
    output = {
        "results": {
            CLOZE: {"alias": CLOZE, "acc,none": 0.25, "acc_stderr,none": 0.05, "perplexity,none": 80.0},
            RECALL: {"alias": RECALL, " ": " "},  # a group's row without metrics
            BPB: {"bits_per_byte,none": 1.5, "bits_per_byte_stderr,none": "N/A"},
        },
        "samples": {},
    }
    assert flat_results(output) == {
        CLOZE: {"acc": 0.25, "acc_stderr": 0.05, "perplexity": 80.0},
        BPB: {"bits_per_byte": 1.5},
    }
    assert downstream_metrics(output)[BPB] == {"bits_per_byte": 1.5}
    assert math.isnan(recall_contrast({})["acc"])


def test_missing_lm_eval_is_one_line_naming_the_install(monkeypatch):
    from pretrain.downstream.harness import lm_eval_version

    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(
        ConfigError, match=r"lm-eval\) is not installed: install it with pip install -e '\.\[eval\]'"
    ):
        lm_eval_version()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"limit": 0}, "--limit 0: give a positive number"),
        ({"batch_size": -1}, "--batch-size -1: give a positive number"),
        ({"examples": 0}, "--examples 0: give a positive number"),
        ({"seed": -2}, "--seed -2: give a seed of 0 or more"),
    ],
)
def test_bad_counts_are_refused_before_any_work(options, message, tmp_path):
    from pretrain.downstream.command import LmEvalRequest, run_lm_eval

    with pytest.raises(ConfigError, match=message):
        run_lm_eval(LmEvalRequest(str(tmp_path / "missing.ckpt"), (CLOZE,), **options))


def test_an_export_runs_the_projects_tasks_only_from_a_written_folder(tmp_path):
    from pretrain.downstream.command import LmEvalRequest, parse_tasks, run_lm_eval

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="pretrain_recall are written from a checkpoint's validation split"):
        run_lm_eval(LmEvalRequest(str(tmp_path), parse_tasks(f"{RECALL}, hellaswag")))
    with pytest.raises(ConfigError, match=f"--tasks-dir {tmp_path} has no pretrain_recall"):
        run_lm_eval(LmEvalRequest(str(tmp_path), (RECALL,), tasks_dir=tmp_path))
    with pytest.raises(ConfigError, match="names no task"):
        parse_tasks(" , ")
    assert parse_tasks("a,b,a") == ("a", "b")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("eval.downstream=['']", r"eval.downstream=\[''\]: every entry must be a task name"),
        ("eval.downstream_limit=0", r"eval.downstream_limit=0 must be >= 1"),
    ],
)
def test_bad_downstream_settings_are_refused(override, message):
    from helpers import compose

    from pretrain.config import to_config

    with pytest.raises(ConfigError, match=message):
        to_config(compose(override))


def test_downstream_is_checked_at_launch(monkeypatch):
    """Hours of training never end in "not installed" or "a mixture has no single validation split"."""
    import importlib.util

    from helpers import compose

    from pretrain.config import to_config
    from pretrain.downstream.after_training import check_downstream

    config = to_config(compose("eval.downstream=[pretrain_cloze,pretrain_recall]"))
    check_downstream(config)  # installed, one source: fine
    mixed = to_config(compose("mixture=pydocs_repo", "eval.downstream=[pretrain_recall]"))
    with pytest.raises(ConfigError, match="this run mixes sources; keep only the harness's own tasks"):
        check_downstream(mixed)
    check_downstream(to_config(compose("mixture=pydocs_repo")))  # nothing asked: nothing checked
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"needs lm-evaluation-harness \(lm-eval\), which is not installed"):
        check_downstream(config)


def test_the_summary_lines_say_the_paired_recall_difference_with_its_interval():
    from pretrain.downstream.after_training import summary_lines

    metrics = {
        CLOZE: {"acc": 0.25, "acc_stderr": 0.01, "perplexity": 41.5},
        RECALL_PLAIN: {"acc": 0.5},
        RECALL: {
            "examples": 120.0,
            "acc": 0.5,
            "acc_distractor": 0.375,
            "loglikelihood_difference": -0.125,
            "loglikelihood_difference_low": -0.25,
            "loglikelihood_difference_high": 0.0,
            "loglikelihood_passage_gain": 0.75,
            "loglikelihood_passage_gain_low": 0.5,
            "loglikelihood_passage_gain_high": 1.0,
        },
    }
    assert summary_lines(metrics) == [
        f"{CLOZE}: acc 0.25, perplexity 41.5",
        f"{RECALL}: acc 0.5000, with a distractor 0.3750; answer log-likelihood: distractor - plain -0.1250 "
        "[-0.2500, +0.0000], passage gain +0.7500 [+0.5000, +1.0000] over 120 paired examples",
    ]


def test_the_harness_runs_as_one_process_after_a_launcher(monkeypatch):
    """Rank 0 of a DDP / srun / torchrun job scores alone: accelerate must not see the launcher's
    variables (it would wait for ranks that exited); they are back afterwards."""
    from pretrain.downstream.harness import LAUNCHER_VARIABLES, one_process

    job = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8", "MASTER_ADDR": "node1", "PMI_SIZE": "8"}
    for name, value in job.items():
        monkeypatch.setenv(name, value)
    with one_process():
        import os

        assert not any(name in os.environ for name in LAUNCHER_VARIABLES)
        from accelerate import PartialState

        try:
            assert PartialState().num_processes == 1 and PartialState().distributed_type.value == "NO"
        finally:
            PartialState._reset_state()  # a singleton: the next user builds its own
    assert {name: os.environ[name] for name in job} == job


def test_runs_that_differ_only_in_their_downstream_tasks_are_one_arm(tmp_path):
    from pretrain.report.arms import swept_keys
    from pretrain.training.run_record import Run

    def run(name: str, downstream: list[str], limit: int | None, lr: float = 1e-3) -> Run:
        config = {
            "data": {"policy": "bestfit"},
            "train": {"lr": lr},
            "eval": {"downstream": downstream, "downstream_limit": limit},
        }
        return Run(tmp_path / name, name, "bestfit", 128, 4, {}, config=config)

    assert swept_keys([run("a", [], None), run("b", [CLOZE, RECALL], 50)]) == []
    assert swept_keys([run("a", [], None), run("b", [CLOZE], 50, lr=2e-3)]) == ["train.lr"]


def test_accuracy_stderr_comes_from_the_samples_without_a_bootstrap():
    """The harness's bootstrap forks a process pool (which can deadlock after torch's threads): it is
    off, and the standard error of a mean metric is sd / sqrt(n) over the logged samples."""
    from statistics import stdev

    from pretrain.downstream.harness import sample_stderrs

    hits = [1, 0, 0, 1, 1, 0, 1, 1]
    output = {
        "results": {CLOZE: {"acc,none": 0.625, "acc_stderr,none": "N/A", "perplexity,none": 9.0}},
        "samples": {CLOZE: [{"doc_id": i, "acc": float(h), "perplexity": -1.5} for i, h in enumerate(hits)]},
    }
    assert sample_stderrs(output) == {CLOZE: {"acc_stderr": pytest.approx(stdev(hits) / math.sqrt(8))}}
    assert downstream_metrics(output)[CLOZE] == {
        "acc": 0.625,
        "perplexity": 9.0,
        "acc_stderr": pytest.approx(stdev(hits) / math.sqrt(8)),
    }


def test_the_launch_check_imports_nothing_of_the_harness_without_downstream_tasks():
    """check_downstream runs at every launch: without eval.downstream it costs no import."""
    import subprocess

    code = (
        "import sys\n"
        "from pretrain.config import load_config, to_config\n"
        "from pretrain.downstream.after_training import check_downstream\n"
        "check_downstream(to_config(load_config(['experiment=smoke'])))\n"
        "heavy = ('lm_eval', 'transformers', 'tokenizers', 'pretrain.downstream.harness')\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
