"""Offline lm-evaluation-harness tasks built from a checkpoint's own validation split.

Three tasks, each a YAML, a jsonl of examples and the shared `utils.py` (harness_utils.py) in one
folder, deterministic for a seed (the same bytes on every machine):

- `pretrain_cloze`: the last word of a validation passage, LAMBADA-style (accuracy of the greedy word,
  perplexity of the word given the passage);
- `pretrain_recall` (a group of `pretrain_recall_plain`, `pretrain_recall_distractor` and
  `pretrain_recall_cue_only`): a passage, a newline, then three words copied from inside it; the
  target is the word that followed them there, which only the passage's own context gives. The
  distractor variant puts another validation passage and the EOS before the same prompt: what a
  model without document masking saw in training. The cue-only control drops the passage: what the
  answer costs a model that does not read it;
- `pretrain_bpb`: every prediction pair of the first validation documents, as the project chunks them
  (one loglikelihood request per chunk: its first input as context, its targets as continuation), so
  the harness's bits per byte is `pretrain eval`'s on the same documents.

The texts are the cached tokens decoded with the tokenizer the export ships, and a request is kept
only when the harness, re-encoding it, gets back exactly these tokens (otherwise its pairs would differ).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from ..data.batching.chunking import chunk_table
from ..data.tokens import TokenSplit

CLOZE, RECALL, BPB = "pretrain_cloze", "pretrain_recall", "pretrain_bpb"
RECALL_PLAIN, RECALL_DISTRACTOR = "pretrain_recall_plain", "pretrain_recall_distractor"
RECALL_CUE_ONLY = "pretrain_recall_cue_only"  # the control: the cue without its passage
RECALL_VARIANTS = (RECALL_PLAIN, RECALL_DISTRACTOR, RECALL_CUE_ONLY)
TASKS = (CLOZE, RECALL, BPB)
MIN_CONTEXT_WORDS = 16  # a cloze target has at least this many words of passage before it
CUE_WORDS = 3  # the recall prompt copies this many words; their next word is the answer
RECALL_GAP_WORDS = 8  # the copied span ends at least this many words before the passage does
FUNCTION_WORDS = frozenset(
    "the and for with that this from into onto over than then they them their there these those what "
    "when where which while will would your you are was were has have had not but can may might must "
    "shall should could its our his her him she who whom whose also only just been being such very "
    "each some any all both other more most".split()
)
"""Not targets: words a context-free guess gets right (LAMBADA's targets are content words too)."""
_WORDS = re.compile(r"\S+")
_CLOZE_WORD = re.compile(r"([A-Za-z]{3,})[.,;:!?\"')\]]*")  # the word, without its closing punctuation
_RECALL_WORD = re.compile(r"([A-Za-z]{4,})[.,;:!?\"')\]]*")


@dataclass(frozen=True)
class TaskSource:
    """What the tasks are built from: the validation split and the tokenizer the export ships
    (a `tokenizers.Tokenizer` with EOS as a special token, as the harness's AutoTokenizer loads it)."""

    split: TokenSplit
    tokenizer: Tokenizer
    eos_text: str
    token_bytes: np.ndarray  # UTF-8 bytes per token id (EOS: 0), as `pretrain eval` counts them
    max_seq_len: int
    seed: int


@dataclass
class TaskFiles:
    """The folder written and what is in it: examples per task file, documents left out of bpb."""

    directory: Path
    examples: dict[str, int] = field(default_factory=dict)
    bpb_documents: list[int] = field(default_factory=list)  # split indices of the scored documents
    bpb_left_out: int = 0  # of the documents considered, those whose text does not re-encode exactly
    # (doc, start, length, bytes) of each scored chunk in order: what the project's own scoring re-scores
    bpb_chunks: list[tuple[int, int, int, int]] = field(default_factory=list)


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


def _decode(tokenizer, ids) -> str:
    return str(tokenizer.decode([int(i) for i in ids], skip_special_tokens=False))


def document_text(source: TaskSource, index: int) -> str:
    """Document `index`'s text: its tokens without the EOS, decoded."""
    return _decode(source.tokenizer, source.split.document(index)[:-1])


def _windows(source: TaskSource, text: str, budget: int) -> list[tuple[int, int]]:
    """Consecutive passages of `text` as (first word, last word) index pairs over its words, each
    at most about `budget` tokens (counted on the document's own encoding; checked exactly later)."""
    words = [m.span() for m in _WORDS.finditer(text)]
    if not words:
        return []
    starts = np.array([a for a, _ in source.tokenizer.encode(text, add_special_tokens=False).offsets])
    begin_tok = np.searchsorted(starts, [a for a, _ in words])
    end_tok = np.searchsorted(starts, [b for _, b in words])
    windows, first = [], 0
    while first < len(words):
        last = int(np.searchsorted(end_tok, begin_tok[first] + budget, side="right")) - 1
        if last < first:  # one word over the budget: skip it
            first += 1
            continue
        windows.append((first, last))
        first = last + 1
    return windows


def _cloze_examples(source: TaskSource, rng: np.random.Generator, count: int) -> list[dict]:
    """One example per passage: its last clean word (letters only after closing punctuation, one
    space before it, at least MIN_CONTEXT_WORDS words in, not a FUNCTION_WORD) as the target, the
    passage before it as the context."""
    examples: list[dict | None] = []
    for index in range(len(source.split)):
        if len(examples) >= count:  # the first documents suffice: bounded work on a large split
            break
        text = document_text(source, index)
        if source.eos_text in text:  # the harness would read it as a document boundary
            continue
        words = list(_WORDS.finditer(text))
        for number, (first, last) in enumerate(_windows(source, text, source.max_seq_len - 8)):
            for j in range(last, first + MIN_CONTEXT_WORDS - 1, -1):
                found = _CLOZE_WORD.fullmatch(words[j].group())
                if found and found.group(1).lower() in FUNCTION_WORDS:
                    continue
                if found and text[words[j].start() - 1] == " " and words[j - 1].end() == words[j].start() - 1:
                    context = text[words[first].start() : words[j].start() - 1]
                    examples.append(_example(source, index, number, context, " " + found.group(1)))
                    break
    return _shuffled([e for e in examples if e is not None], rng)


def _example(source: TaskSource, index: int, window: int, context: str, continuation: str) -> dict | None:
    """An example whose context and continuation fit the model's positions, else None."""
    if len(_encode(source.tokenizer, context + continuation)) > source.max_seq_len:
        return None
    return {
        "document": _document_id(source.split, index),
        "window": window,
        "context": context,
        "continuation": continuation,
    }


def _document_id(split: TokenSplit, index: int) -> str:
    return str(split.ids[index]) if len(split.ids) else str(index)


def _recall_candidates(text: str, words: list[re.Match], first: int, last: int) -> list[int]:
    """Word indices i in the passage whose words i..i+2 are copied and word i+3 is the answer: a
    clean word of 4+ letters (not a FUNCTION_WORD) one space after the cue, the cue on one line and
    unique in the passage, at least RECALL_GAP_WORDS words between the answer and the passage's end."""
    passage = text[words[first].start() : words[last].end()]
    found = []
    for i in range(first, last - CUE_WORDS - RECALL_GAP_WORDS + 1):
        answer = words[i + CUE_WORDS]
        word = _RECALL_WORD.fullmatch(answer.group())
        if not word or word.group(1).lower() in FUNCTION_WORDS:
            continue
        if text[words[i + CUE_WORDS - 1].end() : answer.start()] != " ":
            continue
        cue = text[words[i].start() : words[i + CUE_WORDS - 1].end()]
        if "\n" not in cue and passage.count(cue) == 1:  # one line: the prompt's last line is the cue
            found.append(i)
    return found


def _recall_examples(
    source: TaskSource, rng: np.random.Generator, count: int
) -> tuple[list[dict], list[dict], list[dict]]:
    """(plain, distractor, cue-only) examples, the same prompts in the same order: per passage one
    copied span chosen at random; the distractor is a passage of another document without the cue;
    the control is the cue alone."""
    budget = (source.max_seq_len - 16) // 2  # the distractor and the passage each take at most half
    passages: list[tuple[int, int, str, list[re.Match], int, int]] = []
    for index in range(len(source.split)):
        if len(passages) >= 2 * count:  # the first documents suffice: bounded work on a large split
            break
        text = document_text(source, index)
        if source.eos_text in text:
            continue
        words = list(_WORDS.finditer(text))
        for number, (first, last) in enumerate(_windows(source, text, budget)):
            passages.append((index, number, text, words, first, last))
    plain, distracted, alone = [], [], []
    for index, number, text, words, first, last in passages:
        candidates = _recall_candidates(text, words, first, last)
        if not candidates:
            continue
        i = candidates[int(rng.integers(len(candidates)))]
        passage = text[words[first].start() : words[last].end()]
        cue = text[words[i].start() : words[i + CUE_WORDS - 1].end()]
        answer = " " + _RECALL_WORD.fullmatch(words[i + CUE_WORDS].group()).group(1)  # type: ignore[union-attr]
        other = _other_passage(passages, index, rng)
        if other is None:
            continue
        distractor = other[2][other[3][other[4]].start() : other[3][other[5]].end()]
        if cue in distractor:
            continue
        prompt = f"{passage}\n{cue}"
        one = _example(source, index, number, prompt, answer)
        two = _example(source, index, number, distractor + source.eos_text + prompt, answer)
        if one is not None and two is not None:
            plain.append(one)
            distracted.append({**two, "distractor_document": other[0]})
            alone.append({**one, "context": cue})
    order = rng.permutation(len(plain))
    return [plain[k] for k in order], [distracted[k] for k in order], [alone[k] for k in order]


def _other_passage(passages: list, index: int, rng: np.random.Generator):
    """A passage of another document than `index`, drawn at random (None if there is none)."""
    for _ in range(64):
        other = passages[int(rng.integers(len(passages)))]
        if other[0] != index:
            return other
    others = [p for p in passages if p[0] != index]
    return others[int(rng.integers(len(others)))] if others else None


def _shuffled(examples: list[dict], rng: np.random.Generator) -> list[dict]:
    """`--limit N` takes the first N examples: shuffled, they come from across the split."""
    return [examples[k] for k in rng.permutation(len(examples))]


def _bpb_examples(source: TaskSource, count: int, files: TaskFiles) -> list[dict]:
    """Every chunk of the first documents (whole documents, at least `count` chunks in all when the
    split has them), each chunk one request of its own text: context = its first input, continuation
    = its targets (the last chunk's end with the EOS). A document any of whose chunks the harness
    would encode differently is left out whole."""
    split, tokenizer = source.split, source.tokenizer
    table = chunk_table(split.offsets, split.lengths, source.max_seq_len)
    examples: list[dict] = []
    bounds = np.searchsorted(table.doc, np.arange(len(split) + 1))
    for index in range(len(split)):
        if len(examples) >= count:
            break
        rows = range(int(bounds[index]), int(bounds[index + 1]))
        # a chunk's inputs and targets: its length + 1 tokens from its first input
        spans = [(int(table.start[r]), int(table.start[r] + table.length[r]) + 1) for r in rows]
        found = [_bpb_request(tokenizer, split.tokens[a:b], source, k == 0) for k, (a, b) in enumerate(spans)]
        requests = [request for request in found if request is not None]
        if len(requests) < len(found):
            files.bpb_left_out += 1
            continue
        files.bpb_documents.append(index)
        for number, (row, request) in enumerate(zip(rows, requests, strict=True)):
            files.bpb_chunks.append((index, int(table.start[row]), int(table.length[row]), request["bytes"]))
            examples.append({"document": _document_id(split, index), "chunk": number, **request})
    return examples


def _bpb_request(tokenizer, tokens: np.ndarray, source: TaskSource, first: bool) -> dict | None:
    """The request of the chunk whose inputs are tokens[:-1] and targets tokens[1:], or None when the
    harness would not score exactly these pairs. The harness scores a request as the last
    max_seq_len + 1 tokens of context + continuation; the chunk's own text alone is that window, so
    no token before the chunk is seen (as in training and `pretrain eval`, where a chunk's positions
    restart at 0). Left out: a context ending in whitespace (the harness moves it into the
    continuation) and a text that does not re-encode to the same ids."""
    tokens = np.asarray(tokens, dtype=np.int64)
    context = _decode(tokenizer, tokens[:1])
    whole = _decode(tokenizer, tokens)
    if not context or context != context.rstrip() or not whole.startswith(context):
        return None
    if _encode(tokenizer, context) != tokens[:1].tolist() or _encode(tokenizer, whole) != tokens.tolist():
        return None
    return {
        "context": context,
        "continuation": whole[len(context) :],
        "targets": len(tokens) - 1,
        "bytes": int(source.token_bytes[tokens[0 if first else 1 :]].sum()),
    }


def _yaml(task: str, data_file: str, metrics: list[tuple[str, str, bool]], bpb: bool = False) -> str:
    lines = [
        f"task: {task}",
        "custom_dataset: !function utils.load",
        "dataset_kwargs:",
        f"  data_file: {data_file}",
        "output_type: loglikelihood",
        "test_split: test",
        "doc_to_text: context",
        "doc_to_target: continuation",
        'target_delimiter: ""',
        *(["process_results: !function utils.bits_per_byte"] if bpb else []),
        "metric_list:",
    ]
    for metric, aggregation, higher in metrics:
        lines += [
            f"  - metric: {metric}",
            f"    aggregation: {aggregation}",
            f"    higher_is_better: {str(higher).lower()}",
        ]
    return "\n".join([*lines, "metadata:", "  version: 1.0", ""])


WORD_METRICS = [("acc", "mean", True), ("perplexity", "perplexity", False)]


def write_task_files(directory: Path | str, source: TaskSource, count: int = 1000) -> TaskFiles:
    """Write the three tasks into `directory` (created; existing task files replaced): at most
    `count` examples each (bpb: whole documents until `count` chunks)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files = TaskFiles(directory)
    shutil.copyfile(Path(__file__).with_name("harness_utils.py"), directory / "utils.py")
    rng = np.random.default_rng(source.seed)
    cloze = _cloze_examples(source, rng, count)[:count]
    plain, distracted, alone = _recall_examples(source, rng, count)
    data = {
        CLOZE: (cloze, WORD_METRICS, False),
        RECALL_PLAIN: (plain[:count], WORD_METRICS, False),
        RECALL_DISTRACTOR: (distracted[:count], WORD_METRICS, False),
        RECALL_CUE_ONLY: (alone[:count], WORD_METRICS, False),
        BPB: (_bpb_examples(source, count, files), [("bits_per_byte", "bits_per_byte", False)], True),
    }
    for task, (examples, metrics, bpb) in data.items():
        lines = "".join(json.dumps(e, ensure_ascii=False, sort_keys=True) + "\n" for e in examples)
        (directory / f"{task}.jsonl").write_text(lines, encoding="utf-8")
        (directory / f"{task}.yaml").write_text(_yaml(task, f"{task}.jsonl", metrics, bpb))
        files.examples[task] = len(examples)
    (directory / f"{RECALL}.yaml").write_text(
        "\n".join([f"group: {RECALL}", "task:", *(f"  - {task}" for task in RECALL_VARIANTS), ""])
    )
    return files
