"""A conversation as one document of a source (task=sft): `messages: [{role, content}]` checked and
written as its canonical text, compact key-sorted JSON, which the cache digests, splits and
deduplicates as it does a document's text (data/ingest/chat.py renders it with the chat template)."""

from __future__ import annotations

import json

from ...errors import SourceError

ROLES = ("system", "user", "assistant")
COLUMN = "messages"  # the column a conversation is read from (parquet, JSON lines)


def conversation_text(messages, where: str) -> str:
    """The canonical text of a conversation (`messages: [{role, content}]`): compact, key-sorted JSON.
    The cache digests, splits and deduplicates this text, as it does a document's. Refuses what no
    template can render, naming `where` (file and row)."""
    if not isinstance(messages, list | tuple) or not messages:
        raise SourceError(f"{where}: `messages` must be a non-empty list of {{role, content}} objects")
    clean = []
    for turn, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise SourceError(f"{where}: message {turn} is not a {{role, content}} object")
        role, content = message["role"], message.get("content")
        if role not in ROLES:
            raise SourceError(f"{where}: message {turn} has role {role!r}; the roles are {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise SourceError(f"{where}: message {turn}: `content` is {type(content).__name__}, not a string")
        clean.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in clean):
        raise SourceError(f"{where}: the conversation has no assistant message (nothing to train)")
    return json.dumps(clean, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def conversation_messages(text: str) -> list[dict]:
    return json.loads(text)
