"""The token bitmask of a batch's constrained rows, applied to their logits (chapter 23)."""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from .grammar import RequestGrammar


def fill_bitmask(grammars: Sequence[Tuple[int, RequestGrammar]], batch_size: int,
                 vocab_size: int) -> Tuple[torch.Tensor, List[int]]:
    """(row, grammar) pairs of a batch -> its bitmask (int32 [batch_size, ceil(V / 32)], on
    the host, bit t of a row set when token t is allowed) and the rows to apply it to. A row
    of its own per batch row, as xgrammar's kernel indexes the mask by the logits' row; a
    terminated grammar's row is left out, since that request has finished and its token will
    be dropped."""
    import xgrammar

    bitmask = xgrammar.allocate_token_bitmask(batch_size, vocab_size)  # every token allowed
    rows = []
    for row, grammar in grammars:
        if not grammar.is_terminated:
            grammar.fill(bitmask, row)
            rows.append(row)
    return bitmask, rows


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: List[int]) -> None:
    """Set to -inf, in place, the logits of ``rows`` whose tokens ``bitmask`` leaves out; the
    other rows are not touched. On a GPU xgrammar's kernel does it, on a CPU its own loop."""
    import xgrammar

    if not rows:
        return
    bitmask = bitmask.to(logits.device, non_blocking=True)
    xgrammar.apply_token_bitmask_inplace(logits, bitmask, indices=rows)
