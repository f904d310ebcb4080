"""The ingest phase: from a source to a verified token cache, one job per module.

    tokenizer.py         GPT-2's tokenizer files (bundled, hub or your own) and their identity
    split.py             each document's split, from its sha256 and the split seed
    encode.py            digest, split and tokenize a batch of documents; the tiktoken cross-check
    collect.py           dedup, budgets and writes in source order
    writer.py            the split files (tokens, index) written as documents arrive
    executors.py         in-process or spawned workers, their message protocol and watchdog
    staging.py           multi-task prepare: part files (with their sha256) and their assembly
    builder.py           build_cache: all of the above into a new directory, the manifest last
    cache.py             the cache format: identity, key, manifest (CacheSpec, Cache)
    verify.py            a cache checked against its manifest (quick or full) and opened
    prepare.py           verify / lock / build / reuse: what `pretrain prepare` and a run call
    prepare_settings.py  how a build runs (`PrepareSettings`, the `prepare` group), carried by a CacheSpec

The run time reads a cache through cache.Cache and data/tokens.py (whose split index format,
data/index.py, both phases share).
"""
