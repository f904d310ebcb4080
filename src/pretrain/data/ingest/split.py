"""Document identity and the train/validation split, decided per original document."""

from __future__ import annotations

import hashlib

# Standalone (hashlib only, no package import): tests load this file by path in fresh processes. The
# defaults of seed and fraction are the schema's (pretrain.config.SplitConfig), passed in by the build.


def document_id(text: str) -> str:
    """SHA-256 hex digest of the UTF-8 text: the identity of a document (exact duplicates collide)."""
    return hashlib.sha256(text.encode()).hexdigest()


def document_split(
    document_id: str,
    seed: int,
    validation_fraction: float,
) -> str:
    """'train' or 'validation' for a document id.

    The id is hashed again with the seed so that a different seed gives an independent split; only
    hashlib is used, so the answer is the same in every process, machine and PYTHONHASHSEED.
    """
    if not 0.0 <= validation_fraction <= 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1], got {validation_fraction}")
    digest = hashlib.sha256(f"{seed}:{document_id}".encode()).digest()
    # 64 bits of the digest as a uniform number in [0, 1).
    u = int.from_bytes(digest[:8], "big") / 2**64
    return "validation" if u < validation_fraction else "train"
