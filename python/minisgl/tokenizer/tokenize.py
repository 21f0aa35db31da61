"""A request's prompt as token ids: text, token ids as they are, or chat messages through the
tokenizer's own chat template."""

from __future__ import annotations

import operator
from typing import Any, Dict, List, Sequence

from transformers import PreTrainedTokenizerBase

Message = Dict[str, Any]  # {"role": "user", "content": "Hello"}


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str) -> List[int]:
    """The tokenizer's ids for ``text``, special tokens added as it adds them (as ``LLM``
    encodes a prompt). The empty string is no tokens, for the scheduler to refuse."""
    if not isinstance(text, str):
        raise TypeError(f"a text prompt must be a str, got {type(text).__name__}")
    return list(tokenizer.encode(text)) if text else []


def check_token_ids(ids: Sequence[Any]) -> List[int]:
    """Token ids as they are, as a list of ints; a bool, a float or a negative id is refused.
    Whether an id is below the vocabulary size is the scheduler's check (``check_request``)."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise TypeError(f"token ids must be a list of ints, got {type(ids).__name__}")
    out = []
    for i, token in enumerate(ids):
        try:
            if isinstance(token, bool):
                raise TypeError
            value = operator.index(token)  # numpy's and torch's ints too; not a float
        except TypeError:
            raise ValueError(f"token ids[{i}] is {token!r}: a token id is an int") from None
        if value < 0:
            raise ValueError(f"token ids[{i}] is {value}: a token id is >= 0")
        out.append(value)
    return out


def check_messages(messages: Sequence[Any]) -> List[Message]:
    """A ValueError unless ``messages`` is a non-empty list of ``{"role": str, "content": str}``
    (other keys pass through to the template)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be a dict, got {type(m).__name__}")
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                raise ValueError(f"messages[{i}]['{key}'] must be a str, got {m.get(key)!r}")
    return list(messages)


def apply_chat_template(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message]) -> str:
    """The conversation as the model was trained to read it, ending with the assistant's turn
    opened (``add_generation_prompt``), so that the model writes the reply. The template is the
    tokenizer's own (``chat_template`` in its files)."""
    if tokenizer.chat_template is None:
        raise ValueError("this tokenizer has no chat template: send a prompt, not messages")
    text = tokenizer.apply_chat_template(
        check_messages(messages), tokenize=False, add_generation_prompt=True
    )
    assert isinstance(text, str)
    return text


def tokenize_request(
    tokenizer: PreTrainedTokenizerBase,
    *,
    prompt: str | Sequence[int] | None = None,
    messages: Sequence[Message] | None = None,
) -> List[int]:
    """A request's input ids, from exactly one of ``prompt`` (text, or token ids taken as they
    are) and ``messages`` (chat, through the template).

    The template writes every special token itself (a BOS too, where the model has one), so its
    text is encoded without adding any: the ids are those of
    ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``.
    """
    if (prompt is None) == (messages is None):
        raise ValueError("a request has exactly one of prompt and messages")
    if messages is not None:
        text = apply_chat_template(tokenizer, messages)
        return list(tokenizer.encode(text, add_special_tokens=False))
    if isinstance(prompt, str):
        return encode_text(tokenizer, prompt)
    return check_token_ids(prompt)
