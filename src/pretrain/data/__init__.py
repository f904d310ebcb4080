"""Data by phase: ingest/ (source to verified cache), batching/ (cache to batches), measures/ (what
 they hold); sources/ and the split files (index, files, tokens, gpt2) serve both.

Exports resolve lazily, so `pretrain prepare` (which needs no torch) does not pay for importing it.
"""

from importlib import import_module

_EXPORTS = {
    "EOS_TOKEN_ID": "tokens",
    "TokenSplit": "tokens",
    "IGNORE_INDEX": "batching.batch",
    "PackedBatch": "batching.batch",
    "collate_packed": "batching.batch",
    "gather_packed": "batching.batch",
    "gather_padded": "batching.batch",
    "Chunk": "batching.chunking",
    "ChunkTable": "batching.chunking",
    "chunk_table": "batching.chunking",
    "split_tokens": "batching.chunking",
    "Sampler": "batching.samplers",
    "build_sampler": "batching.samplers",
    "document_id": "ingest.split",
    "document_split": "ingest.split",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
