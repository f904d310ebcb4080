"""What the floors (data/floors.py) cost beside the cache build they follow.

The embedded pydocs cache is built in a fresh root (timed), then its floors are computed (timed: the
token byte table, counting every train pair, choosing λ, scoring the validation pairs, writing
floors.json) and read back (a second start). Target: the floors cost under 5 % of the build. A
synthetic ~10M-token cache (bench_cache.write_synthetic_cache: random ids, so its floors mean nothing)
shows how the counting scales, whole and as the every-k-th-document sample a 2M-token cap makes.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

NAME = "floors"
TARGET_SHARE = 0.05
SYNTHETIC_TOKENS = 10_000_000
SAMPLE_CAP = 2_000_000


def _timed(function):
    started = time.perf_counter()
    value = function()
    return value, time.perf_counter() - started


def _pydocs_row(root: Path) -> dict:
    from pretrain.config import load_config, to_config
    from pretrain.data.floors import spec_floors
    from pretrain.data.ingest.cache import CacheSpec
    from pretrain.data.ingest.prepare import prepare_cache

    os.environ["PRETRAIN_CACHE_ROOT"] = str(root)
    spec = CacheSpec.from_config(to_config(load_config([])))
    cache, build = _timed(lambda: prepare_cache(spec, progress=False))
    floors, first = _timed(lambda: spec_floors(spec, cache))
    _, reuse = _timed(lambda: spec_floors(spec, cache))
    return {
        "corpus": "pydocs",
        "train_tokens": floors["train_tokens_counted"],
        "validation_pairs": floors["validation_pairs"],
        "build_s": build,
        "floors_s": first,
        "floors_reuse_s": reuse,
        "share_of_build": first / build,
        "unigram_nats": floors["unigram"]["nats"],
        "bigram_nats": floors["bigram"]["nats"],
        "unigram_bits_per_byte": floors["unigram"]["bits_per_byte"],
        "bigram_bits_per_byte": floors["bigram"]["bits_per_byte"],
        "lambda": floors["bigram"]["lambda"],
    }


def _synthetic_rows(root: Path) -> list[dict]:
    import numpy as np
    from bench_cache import write_synthetic_cache

    from pretrain.data.floors import split_floors
    from pretrain.data.ingest.verify import open_cache
    from pretrain.gpt2 import GPT2_VOCAB_SIZE

    cache = open_cache(write_synthetic_cache(root, SYNTHETIC_TOKENS), mode="quick")
    token_bytes = np.ones(GPT2_VOCAB_SIZE, dtype=np.int64)
    train, validation = cache.split("train"), cache.split("validation")
    rows = []
    for cap in (SYNTHETIC_TOKENS * 2, SAMPLE_CAP):
        floors, seconds = _timed(lambda cap=cap: split_floors(train, validation, token_bytes, cap=cap))
        rows.append(
            {
                "corpus": f"synthetic {SYNTHETIC_TOKENS / 1e6:.0f}M"
                + (f" cap {cap / 1e6:.0f}M" if cap < SYNTHETIC_TOKENS else ""),
                "train_tokens": floors["train_tokens_counted"],
                "validation_pairs": floors["validation_pairs"],
                "floors_s": seconds,
                "counted_tokens_per_s": floors["train_tokens_counted"] / seconds,
                "lambda": floors["bigram"]["lambda"],
            }
        )
    return rows


def run() -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-floors-") as tmp:
        os.environ.setdefault("PRETRAIN_STATE_DIR", str(Path(tmp) / "state"))
        rows = [_pydocs_row(Path(tmp) / "pydocs"), *_synthetic_rows(Path(tmp) / "synthetic")]
    pydocs = rows[0]
    return {
        "rows": rows,
        "summary": [
            f"pydocs: floors {pydocs['floors_s']:.2f} s = {100 * pydocs['share_of_build']:.1f} % of the "
            f"{pydocs['build_s']:.1f} s build (target < {100 * TARGET_SHARE:.0f} %), reused in "
            f"{1e3 * pydocs['floors_reuse_s']:.0f} ms; unigram {pydocs['unigram_nats']:.3f} nats, bigram "
            f"{pydocs['bigram_nats']:.3f} nats (λ {pydocs['lambda']:.3f})"
        ],
        "target_share": TARGET_SHARE,
        "meets_target": pydocs["share_of_build"] < TARGET_SHARE,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
