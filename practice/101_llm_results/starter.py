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
    raise NotImplementedError
