"""Breaks: token_ids holds every generated token, including the EOS."""

from __future__ import annotations

from typing import Callable


def make_result(
    input_ids: list[int],
    output_ids: list[int],
    ignore_eos: bool,
    eos_ids: set[int],
    decode: Callable[[list[int]], str] | None,
) -> dict:
    """{"text", "token_ids", "prompt_token_ids"} of a finished request."""
    ended_at_eos = bool(output_ids) and not ignore_eos and output_ids[-1] in eos_ids
    ids = output_ids[:-1] if ended_at_eos else output_ids
    text = decode(list(ids)) if decode is not None else None
    return {"text": text, "token_ids": list(ids), "prompt_token_ids": list(input_ids)}
