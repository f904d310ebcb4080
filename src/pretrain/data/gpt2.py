"""GPT-2's fixed facts, one owner for the schema, the data pipeline and the model.

A leaf module (it imports nothing of the package): `pretrain.config`, `pretrain.data` and
`pretrain.model` all read these from here. The tokenizer's pinned hub revision is a config value
(conf/tokenizer/gpt2.yaml), not a constant: a run may point it elsewhere.
"""

from __future__ import annotations

EOS_TEXT = "<|endoftext|>"
"""GPT-2's one special token: it closes every cached document."""
EOS_TOKEN_ID = 50256
"""The id of EOS_TEXT, the last id of GPT-2's vocabulary."""
GPT2_VOCAB_SIZE = 50257
"""Rows of GPT-2's embedding: every id the tokenizer can produce (EOS_TOKEN_ID + 1)."""
