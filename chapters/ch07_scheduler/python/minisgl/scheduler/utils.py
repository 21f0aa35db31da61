from __future__ import annotations

import operator
from dataclasses import dataclass, field, replace
from typing import Dict, List, Sequence

from minisgl.core import Req, SamplingParams
from minisgl.utils.misc import div_ceil


def pages_to_finish(req: Req, page_size: int) -> int:
    """Pages the request may still take: up to its last possible token, less those it holds.

    Its last token is sampled but never run through the model, so it takes no slot."""
    return div_ceil(req.max_len - 1, page_size) - div_ceil(req.cached_len, page_size)


def check_request(
    input_ids: Sequence[int], params: SamplingParams, max_seq_len: int, vocab_size: int
) -> SamplingParams:
    """A ValueError naming what is wrong with a request; else its sampling parameters, with
    max_tokens cut to what the context leaves after the prompt."""
    if len(input_ids) == 0:
        raise ValueError("the prompt is empty: input_ids needs at least one token")
    if len(input_ids) >= max_seq_len:
        raise ValueError(
            f"the prompt has {len(input_ids)} tokens: the context holds "
            f"max_seq_len={max_seq_len}, so a prompt has at most {max_seq_len - 1}"
        )
    for i, token in enumerate(input_ids):
        if not _is_token_id(token, vocab_size):
            raise ValueError(
                f"input_ids[{i}] is {token!r}: a token id is an int in [0, vocab_size={vocab_size})"
            )
    params.validate()
    return replace(params, max_tokens=min(params.max_tokens, max_seq_len - len(input_ids)))


def _is_token_id(token: object, vocab_size: int) -> bool:
    """An integer (numpy's and torch's too; not a bool, not a float) in [0, vocab_size)."""
    if isinstance(token, bool):
        return False  # True is an int to Python, but as a token id it is surely a mistake
    try:
        return 0 <= operator.index(token) < vocab_size
    except TypeError:  # a float, a string ...: not truncated to an id by chance
        return False


@dataclass
class StepOutput:
    """What one scheduler step did: the batch's phase, its requests and how many tokens each
    ran, and the requests that finished, each with why (``Req.finish_reason``'s answer)."""

    phase: str
    uids: List[int]
    extend_lens: List[int]
    finished: Dict[Req, str] = field(default_factory=dict)
