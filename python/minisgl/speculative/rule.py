"""When drafts pay: a verify step costs more than a decode step, and gives more tokens only as
far as the drafts are right. Where a batch is too large for the extra tokens to be nearly free,
or a request's drafts are lately mostly wrong, a decode step without drafts is the better one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Sequence

from minisgl.core import Req


@dataclass
class _Record:
    tokens: float = 0.0  # tokens a verify step with drafts gave the request, a running average
    steps: int = 0  # verify steps with drafts since it last paused
    paused_until: int = 0  # its number of sampled tokens when it may draft again
    pauses: int = 0  # pauses in a row: each one twice as long as the last


class DraftRule:
    """Which requests draft, and whether a batch verifies at all.

    A batch of more than ``max_batch`` requests (None: no limit) decodes without drafts. A
    request whose steps with drafts have lately given it fewer than ``min_tokens`` tokens a
    step (a running average, after ``warmup`` such steps) drafts nothing for its next
    ``pause_tokens`` tokens, then tries again: the text may have turned to quoting. Each pause
    that follows another without a good measure between is twice as long, up to
    ``max_doublings`` times, so that text that never repeats pays for few tries. A verify step
    costs the whole batch, so a batch verifies only when the tokens it is expected to give a
    request, averaged over the batch, reach ``min_tokens`` too: a request without drafts gets
    one token from it, as from a decode step. Everything it measures is the tokens themselves,
    so a request gets the same drafts, and with a seed the same tokens, however fast the
    machine is."""

    def __init__(
        self,
        max_batch: int | None,
        min_tokens: float,
        *,
        warmup: int = 2,
        pause_tokens: int = 32,
        max_doublings: int = 3,
    ):
        self.max_batch, self.min_tokens = max_batch, min_tokens
        self.warmup, self.pause_tokens, self.max_doublings = warmup, pause_tokens, max_doublings
        self.records: Dict[Req, _Record] = {}

    def batch_drafts(self, batch_size: int) -> bool:
        return self.max_batch is None or batch_size <= self.max_batch

    def batch_pays(self, reqs: Sequence[Req], drafting: Sequence[bool]) -> bool:
        """Whether a verify step of ``reqs``, of which those marked in ``drafting`` bring
        drafts, is expected to give a request ``min_tokens`` tokens or more on average: its
        running average for a request that drafts (``min_tokens`` until it has ``warmup`` steps
        measured since its last pause, as a request is judged), 1 for one that does not."""
        if not any(drafting):
            return False
        expected = sum(self._expected(r) if d else 1.0 for r, d in zip(reqs, drafting))
        return expected >= self.min_tokens * len(reqs)

    def _expected(self, req: Req) -> float:
        record = self.records.get(req)
        return self.min_tokens if record is None or record.steps < self.warmup else record.tokens

    def may_draft(self, req: Req) -> bool:
        record = self.records.get(req)
        return record is None or req.num_sampled >= record.paused_until

    def record(self, req: Req, drafted: int, run_len: int) -> None:
        """A verify step gave the request ``run_len`` tokens for ``drafted`` drafts of its own
        (padding not counted), and its ``num_sampled`` counts them already. A step it drafted
        nothing in tells nothing about its drafts."""
        if drafted == 0:
            return
        record = self.records.setdefault(req, _Record())
        record.tokens = run_len if record.steps == 0 else (record.tokens + run_len) / 2
        record.steps += 1
        if record.steps < self.warmup:
            return
        if record.tokens >= self.min_tokens:
            record.pauses = 0
            return
        pause = self.pause_tokens << min(record.pauses, self.max_doublings)
        record.paused_until, record.steps = req.num_sampled + pause, 0
        record.pauses += 1

    def remove(self, req: Req) -> None:
        self.records.pop(req, None)
