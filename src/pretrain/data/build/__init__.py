"""Building a cache, one job per module:

    settings.py   PrepareSettings (the `prepare` group) and how many workers a build uses
    encode.py     digest, split and tokenize a batch of documents; the tiktoken cross-check
    collect.py    dedup, budgets and writes in source order
    executors.py  in-process or spawned workers, their message protocol and watchdog
    staging.py    multi-task prepare: part files (with their sha256) and their assembly
    builder.py    build_cache: all of the above into a new directory, the manifest last

This package's __init__ imports nothing, so that data/cache.py can import settings.py without a cycle
(the builder imports the cache format).
"""
