"""The scheduler's constrained requests: a grammar each, compiled when the request
arrives, followed token by token, and the bitmask of a batch's constrained rows filled while
the batch's forward runs on the device."""

from __future__ import annotations

from typing import Callable, Dict, List, Sequence

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
        self.grammars.pop(req, None)

    def is_done(self, req: Req) -> bool:
        """Its grammar is complete and ended with its stop token (after the host's tokens; with
        overlap the mask has accepted the token already, and nothing is left to catch up)."""
        grammar = self.grammars.get(req)
        if grammar is None:
            return False
        grammar.catch_up(req.output_ids)
        return grammar.is_terminated

    def mask_for(self, batch: Batch, pending: Pending) -> Callable[[torch.Tensor], None] | None:
        """What the engine calls on the batch's logits before sampling, or None when no row
        samples under a grammar (a free batch costs nothing). ``pending`` gives the tokens of
        the batch still in flight, which the matchers need before they can say what comes
        next; waiting for them in the callback lets the device run this batch's forward
        meanwhile. Each row's output is taken now: a verify step appends its drafts to it for
        the length of its forward."""
        rows = [
            (i, self.grammars[r])
            for i, r in enumerate(batch.reqs)
            if r in self.grammars and r.device_len >= len(r.input_ids)
        ]  # not a mid chunk
        if not rows:
            return None
        outputs = [batch.reqs[i].output_ids[:] for i, _ in rows]

        def mask(logits: torch.Tensor) -> None:
            in_flight = pending()
            reqs = batch.reqs
            behind = [
                (g, g.behind(output, in_flight.get(reqs[i])))
                for (i, g), output in zip(rows, outputs)
            ]
            catch_up_all(behind)  # one batch call where every row is one token behind
            bitmask, live = fill_bitmask(
                rows, batch.size, self.vocab_size, pin_memory=logits.is_cuda
            )
            apply_bitmask(logits, bitmask, live)

        return mask


def pending_tokens(
    reqs: Sequence[Req], sampled: Sequence[bool], tokens: Callable[[], List[int]]
) -> Pending:
    """The in-flight batch's tokens by request, read (waiting for their copy) only if asked."""

    def read() -> Dict[Req, int]:
        values = tokens()
        return {r: t for r, t, got in zip(reqs, values, sampled) if got}

    return read
