"""Data: sources, tokenizer, split, cache, chunking, policies, batches.

Exports resolve lazily, so `pretrain prepare` (which needs no torch) does not pay for importing it.
"""

from importlib import import_module

_EXPORTS = {
    "EOS_TOKEN_ID": "tokens",
    "TokenSplit": "tokens",
    "IGNORE_INDEX": "batch",
    "PackedBatch": "batch",
    "collate_packed": "batch",
    "gather_packed": "batch",
    "gather_padded": "batch",
    "Chunk": "chunking",
    "ChunkTable": "chunking",
    "chunk_table": "chunking",
    "split_tokens": "chunking",
    "Sampler": "samplers",
    "build_sampler": "samplers",
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
