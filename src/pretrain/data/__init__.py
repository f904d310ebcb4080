"""Data: sources, tokenizer, split, cache, chunking, policies, batches."""

from .batch import IGNORE_INDEX, PackedBatch, collate_packed, gather_packed, gather_padded
from .chunking import Chunk, ChunkTable, chunk_table, split_tokens
from .samplers import Sampler, build_sampler
from .split import document_id, document_split
from .tokens import EOS_TOKEN_ID, TokenSplit

__all__ = [
    "EOS_TOKEN_ID",
    "IGNORE_INDEX",
    "Chunk",
    "ChunkTable",
    "PackedBatch",
    "Sampler",
    "TokenSplit",
    "build_sampler",
    "chunk_table",
    "collate_packed",
    "document_id",
    "document_split",
    "gather_packed",
    "gather_padded",
    "split_tokens",
]
