"""Penalties and logit bias: the logits of the rows that ask, changed on the device before the
draw.

For token t of a row, with c[t] the times the row's output holds t:

    logit_bias          logit[t] += bias[t]
    repetition_penalty  r: if the prompt or the output holds t, logit[t] / r when it is
                        positive, logit[t] * r when not (SGLang's and vLLM's rule)
    frequency_penalty   logit[t] -= f * c[t]                        (OpenAI's definitions)
    presence_penalty    logit[t] -= p * (c[t] > 0)

in that order, vLLM's. The counts live on the device, one row of the page table's width each
(``PenaltyState``), and grow by one scatter after every draw: the host never sends a request's
history, and a token still on its way to the host (overlap scheduling) is counted already.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import torch

from minisgl.core import Batch, Req


@dataclass
class PenaltyArgs:
    """One batch's rows that ask, as tensors: N rows of the batch."""

    rows: torch.Tensor  # [N] the rows among the batch's B (int64)
    table_rows: torch.Tensor  # [N] their page-table rows, which index the counts (int64)
    presence: torch.Tensor  # [N] float32
    frequency: torch.Tensor  # [N] float32
    repetition: torch.Tensor  # [N] float32
    bias: torch.Tensor | None  # [N, V] float32, or None when no row has a bias


class PenaltyState:
    """Per page-table row: how often its request's output holds each token (``counts``), and
    which tokens its prompt holds (``in_prompt``). Allocated when a request first asks: a
    batch of requests that never do costs one look at each request's parameters."""

    def __init__(self, num_rows: int, vocab_size: int, device: torch.device):
        self.num_rows, self.vocab_size, self.device = num_rows, vocab_size, device
        self.counts: torch.Tensor | None = None  # [rows, V] float32
        self.in_prompt: torch.Tensor | None = None  # [rows, V] bool

    def prepare(self, batch: Batch) -> PenaltyArgs | None:
        """The batch's penalty rows, or None when none asks. A request that samples its first
        token in this batch starts from a clean row: no output, its prompt's tokens marked."""
        asking = [i for i, r in enumerate(batch.reqs) if r.sampling_params.has_penalties]
        if not asking:
            return None
        reqs = [batch.reqs[i] for i in asking]
        self._allocate()
        for req in reqs:
            if batch.is_prefill and req.device_len >= len(req.input_ids):
                self._start(req)
        return _args(asking, reqs, self.vocab_size, self.device)

    def _allocate(self) -> None:
        if self.counts is None:
            shape = (self.num_rows, self.vocab_size)
            self.counts = torch.zeros(shape, dtype=torch.float32, device=self.device)
            self.in_prompt = torch.zeros(shape, dtype=torch.bool, device=self.device)

    def _start(self, req: Req) -> None:
        assert self.counts is not None and self.in_prompt is not None
        self.counts[req.table_idx].zero_()
        self.in_prompt[req.table_idx].zero_()
        self.in_prompt[req.table_idx, _on(req.input_ids, torch.long, self.device)] = True

    def apply(self, logits: torch.Tensor, args: PenaltyArgs) -> None:
        """Change the asking rows of ``logits`` [B, V] in place."""
        assert self.counts is not None and self.in_prompt is not None
        counts = self.counts[args.table_rows]
        seen = self.in_prompt[args.table_rows] | (counts > 0)
        logits[args.rows] = apply_penalties(logits[args.rows], counts, seen, args)

    def count(self, tokens: torch.Tensor, args: PenaltyArgs) -> None:
        """The batch's drawn tokens [B]: one more of each in its row's counts."""
        assert self.counts is not None
        self.counts[args.table_rows, tokens[args.rows]] += 1.0  # rows are distinct


def apply_penalties(
    logits: torch.Tensor, counts: torch.Tensor, seen: torch.Tensor, args: PenaltyArgs
) -> torch.Tensor:
    """The changed logits [N, V] of the asking rows: ``counts`` [N, V] of their outputs,
    ``seen`` [N, V] whether the prompt or the output holds each token."""
    logits = logits.float()
    if args.bias is not None:
        logits = logits + args.bias
    r = args.repetition[:, None]
    logits = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
    logits = logits - args.frequency[:, None] * counts
    return logits - args.presence[:, None] * (counts > 0)


def _args(
    rows: List[int], reqs: Sequence[Req], vocab_size: int, device: torch.device
) -> PenaltyArgs:
    params = [r.sampling_params for r in reqs]
    host = _on(  # one copy, not five
        [
            rows,
            [r.table_idx for r in reqs],
            [p.presence_penalty for p in params],
            [p.frequency_penalty for p in params],
            [p.repetition_penalty for p in params],
        ],
        torch.float64,
        device,
    )
    return PenaltyArgs(
        host[0].long(),
        host[1].long(),
        host[2].float(),
        host[3].float(),
        host[4].float(),
        _bias(params, vocab_size, device),
    )


def _bias(params: Sequence, vocab_size: int, device: torch.device) -> torch.Tensor | None:
    """[N, V]: each row's logit_bias spread over the vocabulary, or None when none has one.
    Made on the device from the few (row, token, bias) entries: a host-side [N, V] would be
    0.6 MB a row at a 150k vocabulary, copied every step."""
    entries = [
        (i, token, value)
        for i, p in enumerate(params)
        for token, value in (p.logit_bias or {}).items()
    ]
    if not entries:
        return None
    # rows, tokens and biases in one copy (float64 holds every token id exactly)
    rows, tokens, values = _on(list(zip(*entries)), torch.float64, device)
    bias = torch.zeros(len(params), vocab_size, dtype=torch.float32, device=device)
    bias[rows.long(), tokens.long()] = values.float()
    return bias


def _on(values: List, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The values on the device without the host waiting: from pageable memory a copy would
    wait for the device to finish the forward in flight (overlap scheduling's), from pinned
    memory it is queued behind it."""
    host = torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)
