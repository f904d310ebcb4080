"""The `utils.py` copied beside the generated lm-evaluation-harness task files (task_files.py).

The harness imports it from the task folder (`!function utils.load` in a task YAML), so it reads the
examples next to itself and needs no pretrain installed: a folder of generated tasks runs under a
plain `lm_eval --include_path DIR`, on any machine with lm-eval.
"""

import json
from pathlib import Path


def _rows(name: str) -> list[dict]:
    text = Path(__file__).with_name(name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line]


def load(data_file: str, **_metadata):
    """The task's examples (`dataset_kwargs: {data_file: ...}`) as its one `test` split."""
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(_rows(data_file))})


def bits_per_byte(doc: dict, results: list) -> dict:
    """pretrain_bpb: the chunk's summed log-likelihood and the UTF-8 bytes of its targets (the harness's
    `bits_per_byte` aggregation divides the sums)."""
    loglikelihood, _greedy = results[0]
    return {"bits_per_byte": (loglikelihood, doc["bytes"])}
