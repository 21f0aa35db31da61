"""The token bitmask of a batch's constrained rows, applied to their logits."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, List, Sequence, Tuple

import torch

from .grammar import RequestGrammar

if TYPE_CHECKING:
    import xgrammar


def fill_bitmask(
    grammars: Sequence[Tuple[int, RequestGrammar]],
    batch_size: int,
    vocab_size: int,
    pin_memory: bool = False,
) -> Tuple[torch.Tensor, List[int]]:
    """(row, grammar) pairs of a batch -> its bitmask (int32 [batch_size, ceil(V / 32)], on
    the host, bit t of a row set when token t is allowed) and the rows to apply it to. A row
    of its own per batch row, as xgrammar's kernel indexes the mask by the logits' row; a
    terminated grammar's row is left out, since that request has finished and its token will
    be dropped; rows left out are not written (nothing reads them). The rows are filled by one
    xgrammar call, in C++ on its own threads, not by a Python loop over them. ``pin_memory``
    for a GPU: a copy from pageable memory may wait for the device to run everything queued
    before it (the forward it should overlap)."""

    words = -(-vocab_size // 32)  # xgrammar's allocate_token_bitmask, in pinned memory if asked
    bitmask = torch.empty((batch_size, words), dtype=torch.int32, pin_memory=pin_memory)
    live = [(row, grammar) for row, grammar in grammars if not grammar.is_terminated]
    if live:
        matchers = [grammar.matcher for _, grammar in live]
        _batch_matcher().batch_fill_next_token_bitmask(matchers, bitmask, [r for r, _ in live])
    return bitmask, [row for row, _ in live]


@lru_cache(maxsize=1)
def _batch_matcher() -> xgrammar.BatchGrammarMatcher:
    """xgrammar's batch filler, with its threads (half the host's cores), made once."""
    import xgrammar

    return xgrammar.BatchGrammarMatcher()


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: List[int]) -> None:
    """Set to -inf, in place, the logits of ``rows`` whose tokens ``bitmask`` leaves out; the
    other rows are not touched. On a GPU xgrammar's kernel does it, on a CPU its own loop."""
    import xgrammar

    if not rows:
        return
    if not logits.is_cuda:
        xgrammar.apply_token_bitmask_inplace(logits, bitmask, indices=rows)
        return
    # both copies from pinned memory, so that the host does not wait for the forward
    indices = torch.tensor(rows, dtype=torch.int32, pin_memory=True)
    xgrammar.apply_token_bitmask_inplace(
        logits,
        bitmask.to(logits.device, non_blocking=True),
        indices=indices.to(logits.device, non_blocking=True),
    )
