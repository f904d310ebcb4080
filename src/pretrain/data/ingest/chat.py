"""Conversations to tokens and a per-token loss mask (task=sft): the chat template rendered with
transformers' own jinja renderer (`render_jinja_template`, what `apply_chat_template` runs), the text
tokenized once with the template's special tokens recognised, and each token marked as
apply_chat_template(return_assistant_tokens_mask=True) marks it (it overlaps a `{% generation %}` span).

The cache stores one byte per token beside the tokens (`<split>.mask.bin`):
  TRAINED (bit 0): the token is a trained target (the pair previous token -> this token counts);
  CUT     (bit 1): whole exchanges end before this token (data.long_docs=truncate cuts only here).
A conversation's first token is never TRAINED (it has no previous token). `task.loss_mask` decides
TRAINED: `assistant` (tokens of the generation spans: the replies), `completion` (every token from the
first reply on) or `all` (every token). The template's special tokens are recognised in the template,
never in a message: a conversation whose messages hold a special token's text is left out and counted
(`special_text_skipped` in the manifest), so a message cannot fake a turn or a document boundary.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CheckpointError, ConfigError, SourceError
from ..sources.conversations import conversation_messages
from ..tokens import CUT, TRAINED
from .tokenizer import Encoder, TokenizerFiles, build_tokenizer

BUNDLED_TEMPLATE = "plain"  # templates/plain.jinja: plain-text turns for tokenizers without one


class LossMask(StrEnum):
    """`task.loss_mask`: which targets of a conversation train (part of the cache identity)."""

    assistant = "assistant"  # the assistant replies only (their generation spans)
    completion = "completion"  # everything from the first reply on
    all = "all"  # every token after the first


@dataclass(frozen=True)
class ChatSettings:
    """What turns conversations into tokens and masks (picklable: prepare workers receive it)."""

    loss_mask: str
    template: str  # the jinja text
    template_origin: str  # where it came from (messages, the manifest)

    def identity(self) -> dict:
        """The cache identity's `chat` entry: the mask and the template's bytes."""
        return {
            "loss_mask": str(self.loss_mask),
            "template_sha256": hashlib.sha256(self.template.encode()).hexdigest(),
        }


def bundled_template(name: str = BUNDLED_TEMPLATE) -> str:
    return (resources.files(__package__) / "templates" / f"{name}.jinja").read_text(encoding="utf-8")


def resolve_template(setting: str | None, files: TokenizerFiles) -> tuple[str, str]:
    """(template text, origin) for `task.chat_template`: null = the tokenizer's own (the
    `chat_template` of a tokenizer_config.json beside its tokenizer.json), else the bundled `plain`;
    `plain` = the bundled one; anything else a .jinja file."""
    if setting in (None, "", BUNDLED_TEMPLATE):
        beside = Path(files.vocab).with_name("tokenizer_config.json")
        if setting is None and hasattr(files, "eos_token_id") and beside.is_file():
            try:
                template = json.loads(beside.read_text(encoding="utf-8")).get("chat_template")
            except (OSError, ValueError, AttributeError) as error:
                raise ConfigError(
                    f"{beside} cannot be read ({error}); fix it or set task.chat_template"
                ) from None
            if isinstance(template, str) and template:
                return template, str(beside)
        return bundled_template(), f"bundled:{BUNDLED_TEMPLATE}"
    path = Path(setting).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"task.chat_template={setting!r} is not a file; give a .jinja file, `plain` (the bundled "
            "template) or null (the tokenizer's own)"
        )
    return path.read_text(encoding="utf-8"), str(path.resolve())


def trained_template(hparams: dict, files: TokenizerFiles) -> dict:
    """A task=sft checkpoint's chat template as tokenizer_config.json's `chat_template` (so an export's
    apply_chat_template renders what it trained on), checked against the sha256 its cache identity
    records; {} for any other run."""
    task = (hparams.get("run_config") or {}).get("task") or {}
    recorded = ((hparams.get("cache_identity") or {}).get("chat") or {}).get("template_sha256")
    if str(task.get("name")) != "sft" or not recorded:
        return {}
    template, origin = resolve_template(task.get("chat_template"), files)
    if hashlib.sha256(template.encode()).hexdigest() != recorded:
        raise CheckpointError(
            f"the chat template {origin} is not the one the run trained with (its sha256 differs): "
            "restore that template file"
        )
    return {"chat_template": template}


def chat_settings(loss_mask: str, template_setting: str | None, files: TokenizerFiles) -> ChatSettings:
    """The settings of a task=sft cache; refuses a mask it does not know or a template without the
    `{% generation %}` spans the mask and the cut points are read from."""
    if str(loss_mask) not in list(LossMask):
        raise ConfigError(f"task.loss_mask={loss_mask!r} is not one of {', '.join(LossMask)}")
    template, origin = resolve_template(template_setting, files)
    if "generation" not in template or "endgeneration" not in template:
        raise ConfigError(
            f"the chat template ({origin}) marks no assistant reply with {{% generation %}} ... "
            "{% endgeneration %}: the loss mask and the turn cuts are read from those spans. Give a "
            "template that has them with task.chat_template=FILE (or `plain`, the bundled one)"
        )
    return ChatSettings(loss_mask=str(loss_mask), template=template, template_origin=origin)


def check_task(config, source) -> None:
    """task=sft reads conversations into one masked cache, task=pretrain documents: `source` (the run's,
    or a mixture component's) must hold what the task reads; what task=sft does not support yet is
    refused, saying what to do instead."""
    from ..sources import holds_conversations

    sft = str(config.task.name) == "sft"
    kind = source.kind
    if sft and not holds_conversations(source):
        raise ConfigError(
            f"task=sft trains on conversations, source={kind} holds documents: choose source=chatdocs "
            "(offline) or source=chat source.files='[chats.jsonl]'"
        )
    if not sft and holds_conversations(source):
        raise ConfigError(
            f"source={kind} holds conversations: train them with task=sft (or pretrain on documents: "
            "source=pydocs, local, fineweb)"
        )
    if not sft:
        return
    refused = {
        "a mixture": config.mixture is not None,
        "split.decontaminate=true": config.split.decontaminate is True,
        f"prepare.tasks={config.prepare.tasks}": config.prepare.tasks != 1,
    }
    for setting, set_here in refused.items():
        if set_here:
            raise ConfigError(
                f"task=sft does not support {setting} yet (docs/sft.md): prepare and train one "
                "conversation source in one process (prepare.num_proc workers are fine)"
            )


# --- rendering and encoding ---------------------------------------------------------------------


def render(settings: ChatSettings, messages: list[dict], eos_text: str) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and its generation spans (character ranges), as transformers renders."""
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError as error:
        raise ConfigError(
            "task=sft renders chat templates with transformers' render_jinja_template, which this "
            f"environment lacks ({error}): pip install -U -e '.[hf]'"
        ) from error
    # With the mask it returns (texts, spans per text); its annotation says str.
    out: Any = render_jinja_template(
        conversations=[messages],
        chat_template=settings.template,
        return_assistant_tokens_mask=True,
        eos_token=eos_text,
    )
    rendered, spans = out
    return rendered[0], [(int(start), int(end)) for start, end in spans[0]]


def token_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> np.ndarray:
    """1 for each token overlapping a span: apply_chat_template's assistant mask, token by token."""
    mask = np.zeros(len(offsets), dtype=np.uint8)
    span = 0
    for index, (start, end) in enumerate(offsets):
        while span < len(spans) and start >= spans[span][1]:
            span += 1
        if span == len(spans):
            break
        if end > spans[span][0]:
            mask[index] = 1
    return mask


@functools.lru_cache(maxsize=4)
def _template_tokenizer(files: TokenizerFiles):
    """The tokenizer with its special tokens recognised in the rendered text (the template's)."""
    if hasattr(files, "eos_token_id"):  # a tokenizer.json
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(files.vocab))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        return tokenizer
    return build_tokenizer(files, special_tokens=True)


class ChatEncoder(Encoder):
    """Conversations (their canonical text) to ids and mask bytes, back to back, EOS after each."""

    name = "chat"

    def __init__(self, files: TokenizerFiles, settings: ChatSettings):
        self.files, self.settings = files, settings
        self.tokenizer = _template_tokenizer(files)
        self.eos_token_id = int(getattr(files, "eos_token_id", Encoder.eos_token_id))
        self.eos_text = self.tokenizer.id_to_token(self.eos_token_id)
        self.special = [t.content for t in self.tokenizer.get_added_tokens_decoder().values() if t.special]

    def encode_conversation(self, text: str, origin: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(ids, mask bytes) of one conversation, EOS last; None when a message holds a special
        token's text (left out)."""
        messages = conversation_messages(text)
        if any(s in m["content"] for m in messages for s in self.special):
            return None
        try:
            rendered, spans = render(self.settings, messages, self.eos_text)
        except Exception as error:  # jinja's TemplateError, raise_exception(...) in the template
            raise SourceError(
                f"{origin}: the chat template cannot render this conversation ({error})"
            ) from None
        encoding = self.tokenizer.encode(rendered, add_special_tokens=False)
        ids = np.asarray(encoding.ids, dtype=np.uint32)
        replies = token_mask(encoding.offsets, spans)
        mode = LossMask(self.settings.loss_mask)
        if mode == LossMask.assistant:
            trained = replies.copy()
        elif mode == LossMask.completion:
            trained = np.zeros_like(replies)
            first = np.flatnonzero(replies)
            trained[first[0] if len(first) else len(trained) :] = 1
        else:
            trained = np.ones_like(replies)
        if not len(ids) or ids[-1] != self.eos_token_id:  # one EOS closes every document
            ids = np.append(ids, np.uint32(self.eos_token_id))
            trained = np.append(trained, np.uint8(mode != LossMask.assistant))
            replies = np.append(replies, np.uint8(0))
        mask = trained * TRAINED
        ends = np.flatnonzero(replies[:-1] & ~replies[1:]) + 1  # the token after each reply's last
        mask[ends] |= CUT
        mask[0] &= ~TRAINED
        return ids, mask.astype(np.uint8)

    def encode_masked(self, texts: list[str], origins: list[str]):
        """(ids, lengths, mask, kept): the conversations back to back; `kept[i]` False for one left out."""
        encoded = [self.encode_conversation(t, o) for t, o in zip(texts, origins, strict=True)]
        kept = np.array([e is not None for e in encoded], dtype=bool)
        pairs = [e for e in encoded if e is not None]
        lengths = np.fromiter((len(ids) for ids, _ in pairs), dtype=np.int64, count=len(pairs))
        ids = np.concatenate([i for i, _ in pairs]) if pairs else np.zeros(0, np.uint32)
        mask = np.concatenate([m for _, m in pairs]) if pairs else np.zeros(0, np.uint8)
        return ids, lengths, mask, kept

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids, lengths, _, _ = self.encode_masked(texts, [""] * len(texts))
        return ids, lengths
