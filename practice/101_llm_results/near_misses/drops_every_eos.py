"""Breaks: only that last id is dropped; an EOS id elsewhere stays."""

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
    ids = [i for i in output_ids if ignore_eos or i not in eos_ids]
    text = decode(list(ids)) if decode is not None else None
    return {"text": text, "token_ids": list(output_ids), "prompt_token_ids": list(input_ids)}
