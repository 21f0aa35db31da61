"""Log-probabilities in the two shapes of OpenAI's API.

``/v1/completions`` (``logprobs: k``) has the legacy shape, four lists over the reply's tokens:

    {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}, ...],
     "text_offset": [...]}

where each ``top_logprobs`` entry holds the k most likely tokens and always the sampled one, so
up to k + 1 (OpenAI's rule), and with ``echo`` the prompt's tokens come first, the first of
them with None in both lists. ``/v1/chat/completions`` (``logprobs: true``, ``top_logprobs: k``)
has one object a token:

    {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}

A token's text is its bytes decoded, a byte that is part of a character shown as U+FFFD; the
chat shape's ``bytes`` are exact.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any, Dict, List

from minisgl.message.frontend import TextLogprobs


def token_text(token: bytes) -> str:
    return token.decode("utf-8", errors="replace")


def completion_logprobs(lp: TextLogprobs, start: int = 0) -> Dict[str, Any]:
    """The legacy shape of ``lp``'s tokens, whose text begins at character ``start`` of the
    reply's text."""
    tokens = [token_text(b) for b in lp.token_bytes]
    offsets = list(accumulate((len(t) for t in tokens[:-1]), initial=start))
    top: List[Dict[str, float] | None] = []
    for token, logprob, ids_bytes, values in zip(
        tokens, lp.logprobs, lp.top_bytes, lp.top_logprobs
    ):
        if logprob is None:  # the prompt's first token: nothing before it predicts it
            top.append(None)
            continue
        entry = {token_text(b): v for b, v in zip(ids_bytes, values)}
        entry.setdefault(token, logprob)  # the sampled token, always there
        top.append(entry)
    return {
        "tokens": tokens,
        "token_logprobs": list(lp.logprobs),
        "top_logprobs": top,
        "text_offset": offsets if tokens else [],
    }


def joined(first: Dict[str, Any], second: Dict[str, Any]) -> Dict[str, Any]:
    """Two stretches of the legacy shape, one after the other (the prompt's, then the
    output's)."""
    return {key: first[key] + second[key] for key in first}


def chat_logprobs(lp: TextLogprobs) -> Dict[str, Any]:
    """The chat shape of ``lp``'s tokens."""
    content = []
    for token, logprob, ids_bytes, values in zip(
        lp.token_bytes, lp.logprobs, lp.top_bytes, lp.top_logprobs
    ):
        top = [_chat_token(b, v) for b, v in zip(ids_bytes, values)]
        content.append({**_chat_token(token, logprob), "top_logprobs": top})
    return {"content": content}


def _chat_token(token: bytes, logprob: float | None) -> Dict[str, Any]:
    return {"token": token_text(token), "logprob": logprob, "bytes": list(token)}
