"""Building a cache, one job per module:

    encode.py     digest, split and tokenize a batch of documents; the tiktoken cross-check
    collect.py    dedup, budgets and writes in source order
    executors.py  in-process or spawned workers, their message protocol and watchdog
    staging.py    multi-task prepare: part files (with their sha256) and their assembly
    builder.py    build_cache: all of the above into a new directory, the manifest last

How a build runs (`PrepareSettings`, the `prepare` group) is data/prepare_settings.py, below both this
package and the cache format (a CacheSpec carries it; the builder imports the cache format).
"""
