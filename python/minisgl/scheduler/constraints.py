"""The scheduler's constrained requests: a grammar each, compiled when the request
arrives, followed token by token, and the bitmask of a batch's constrained rows filled on a
thread of its own while the batch's forward is prepared and runs."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Dict, List, Sequence, Tuple

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.structured import (
    GrammarCompiler,
    RequestGrammar,
    apply_bitmask,
    catch_up_all,
    constraint_of,
    fill_bitmask,
)

Pending = Callable[[], Dict[Req, int]]  # tokens sampled on the device, not processed yet


class GrammarManager:
    """Every constrained request's grammar. Free requests never reach xgrammar: it is
    imported, with the model's tokenizer, at the first constrained one."""

    def __init__(self, tokenizer_path: str, vocab_size: int):
        self.tokenizer_path, self.vocab_size = tokenizer_path, vocab_size
        self._compiler: GrammarCompiler | None = None
        self.grammars: Dict[Req, RequestGrammar] = {}
        self._worker: ThreadPoolExecutor | None = None  # made at the first constrained batch
        self._filling: Future | None = None  # the last mask's work, which owns the matchers
        self._pin = torch.cuda.is_available()

    def add(self, req: Req) -> None:
        """Compile the request's constraint, if it has one; a ValueError with xgrammar's
        message when it cannot be compiled (the request is then not queued)."""
        constraint = constraint_of(req.sampling_params)
        if constraint is not None:
            self.grammars[req] = self.compiler.matcher(constraint)

    def check(self, params: SamplingParams) -> None:
        """A ValueError if the constraint cannot be compiled (the compiled grammar is kept)."""
        constraint = constraint_of(params)
        if constraint is not None:
            self.compiler.compile(constraint)

    @property
    def compiler(self) -> GrammarCompiler:
        if self._compiler is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
            self._compiler = GrammarCompiler(tokenizer, self.vocab_size)
        return self._compiler

    def remove(self, req: Req) -> None:
        self._settle()
        self.grammars.pop(req, None)

    def is_done(self, req: Req) -> bool:
        """Its grammar is complete and ended with its stop token (after the host's tokens; with
        overlap the mask has accepted the token already, and nothing is left to catch up)."""
        grammar = self.grammars.get(req)
        if grammar is None:
            return False
        self._settle()
        grammar.catch_up(req.output_ids)
        return grammar.is_terminated

    def mask_for(self, batch: Batch, pending: Pending) -> Callable[[torch.Tensor], None] | None:
        """What the engine calls on the batch's logits before sampling, or None when no row
        samples under a grammar (a free batch costs nothing). ``pending`` gives the tokens of
        the batch still in flight, which the matchers need before they can say what comes
        next. The work starts here, on the manager's thread: it waits for those tokens, catches
        the matchers up and fills the bitmask while this thread prepares the batch and runs its
        forward (on a CPU, computes it); the callback waits for it and applies the bitmask."""
        rows = [
            (i, self.grammars[r])
            for i, r in enumerate(batch.reqs)
            if r in self.grammars and r.device_len >= len(r.input_ids)
        ]  # not a mid chunk
        if not rows:
            return None
        self._settle()  # the matchers are the last mask's until its work is over
        # each row's output as it is now: the scheduler's thread may append to it meanwhile
        # (a verify step's drafts, for the length of its forward)
        outputs = [batch.reqs[i].output_ids[:] for i, _ in rows]
        work = self.worker.submit(self._fill, batch, rows, outputs, pending)
        self._filling = work

        def mask(logits: torch.Tensor) -> None:
            bitmask, live = work.result()  # raises what the work raised
            apply_bitmask(logits, bitmask, live)

        return mask

    @property
    def worker(self) -> ThreadPoolExecutor:
        """One thread: a batch's mask work follows the one before it, in order."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        return self._worker

    def _fill(
        self, batch: Batch, rows: Rows, outputs: List[List[int]], pending: Pending
    ) -> Tuple[torch.Tensor, List[int]]:
        """On the worker: every row's matcher caught up with its output (``outputs``, taken at
        ``mask_for``) and the in-flight token, then the batch's bitmask and the rows to apply
        it to."""
        in_flight = pending()
        reqs = batch.reqs
        catch_up_all(
            [(g, g.behind(output, in_flight.get(reqs[i]))) for (i, g), output in zip(rows, outputs)]
        )
        # pinned where there is a GPU: a copy from pageable memory waits for the device
        return fill_bitmask(rows, batch.size, self.vocab_size, pin_memory=self._pin)

    def _settle(self) -> None:
        """Wait for the last mask's work, which may still be reading the matchers."""
        if self._filling is not None:
            self._filling.exception()  # its error, if any, goes to the mask's callback
            self._filling = None


Rows = List[Tuple[int, RequestGrammar]]  # (batch row, its grammar) of the constrained rows


def pending_tokens(
    reqs: Sequence[Req], sampled: Sequence[bool], tokens: Callable[[], List[int]]
) -> Pending:
    """The in-flight batch's tokens by request, read (waiting for their copy) only if asked."""

    def read() -> Dict[Req, int]:
        values = tokens()
        return {r: t for r, t, got in zip(reqs, values, sampled) if got}

    return read
