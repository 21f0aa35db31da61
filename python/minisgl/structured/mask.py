"""The token bitmask of a batch's constrained rows, applied to their logits."""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from .grammar import RequestGrammar


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
    be dropped. ``pin_memory`` for a GPU: a copy from pageable memory may wait
    for the device to run everything queued before it (the forward it should overlap)."""
    words = -(-vocab_size // 32)  # xgrammar's allocate_token_bitmask, in pinned memory if asked
    bitmask = torch.full((batch_size, words), -1, dtype=torch.int32, pin_memory=pin_memory)
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
