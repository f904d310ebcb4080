"""What the floors (data/measures/floors.py) cost beside the cache build they follow.

The embedded pydocs cache is built in a fresh root (timed), then its floors are computed (timed: the
token byte table, counting every train pair, choosing λ, scoring the validation pairs, writing
floors.json) and read back (a second start). Target: the floors cost under 5 % of the build. A
synthetic ~10M-token cache (bench_cache.write_synthetic_cache: random ids, so its floors mean nothing)
shows how the counting scales, whole and as the every-k-th-document sample a 2M-token cap makes, and
what split.decontaminate's leak check (data/leaks.py) reads per second: what it costs at 10B tokens.
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
    from pretrain.data.ingest.cache import CacheSpec
    from pretrain.data.ingest.prepare import prepare_cache
    from pretrain.data.measures.floors import spec_floors

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
        "bigram_kn_nats": floors["bigram_kn"]["nats"],
        "bigram_kn_bits_per_byte": floors["bigram_kn"]["bits_per_byte"],
        "kn_discount": floors["bigram_kn"]["discount"],
        "jm_minus_kn_nats": floors["bigram"]["nats"] - floors["bigram_kn"]["nats"],
    }


def _leak_row(train, validation) -> dict:
    """The leak check of split.decontaminate on the synthetic cache: train tokens hashed per second."""
    from pretrain.data.leaks import leaked_documents

    leaked, seconds = _timed(lambda: leaked_documents(train, validation))
    rate = train.num_tokens / seconds
    return {
        "corpus": f"synthetic {SYNTHETIC_TOKENS / 1e6:.0f}M leak check",
        "train_tokens": train.num_tokens,
        "validation_tokens": validation.num_tokens,
        "leaks": len(leaked),
        "leak_check_s": seconds,
        "leak_check_tokens_per_s": rate,
        "minutes_at_10B": 10e9 / rate / 60,
    }


def _synthetic_rows(root: Path) -> list[dict]:
    import numpy as np
    from bench_cache import write_synthetic_cache

    from pretrain.data.gpt2 import GPT2_VOCAB_SIZE
    from pretrain.data.ingest.verify import open_cache
    from pretrain.data.measures.floors import split_floors

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
    rows.append(_leak_row(train, validation))
    return rows


def run() -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-floors-") as tmp:
        os.environ.setdefault("PRETRAIN_STATE_DIR", str(Path(tmp) / "state"))
        rows = [_pydocs_row(Path(tmp) / "pydocs"), *_synthetic_rows(Path(tmp) / "synthetic")]
    pydocs, leaks = rows[0], rows[-1]
    return {
        "rows": rows,
        "summary": [
            f"pydocs: floors {pydocs['floors_s']:.2f} s = {100 * pydocs['share_of_build']:.1f} % of the "
            f"{pydocs['build_s']:.1f} s build (target < {100 * TARGET_SHARE:.0f} %), reused in "
            f"{1e3 * pydocs['floors_reuse_s']:.0f} ms; unigram {pydocs['unigram_nats']:.3f} nats, bigram "
            f"{pydocs['bigram_nats']:.3f} nats (λ {pydocs['lambda']:.3f}), Kneser-Ney bigram "
            f"{pydocs['bigram_kn_nats']:.3f} nats (D {pydocs['kn_discount']:.3f})",
            f"split.decontaminate's leak check: {leaks['leak_check_tokens_per_s'] / 1e6:.1f}M train tokens/s "
            f"on one core, ~{leaks['minutes_at_10B']:.0f} min at 10B train tokens",
        ],
        "target_share": TARGET_SHARE,
        "meets_target": pydocs["share_of_build"] < TARGET_SHARE,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
