"""A request's constraint, compiled by xgrammar against the model's tokenizer, and the matcher
that follows the request's tokens through it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Dict, List, Literal, Sequence, Tuple

import torch

from minisgl.core import SamplingParams

if TYPE_CHECKING:
    import xgrammar

Kind = Literal["json_schema", "regex", "ebnf"]


@dataclass(frozen=True)
class Constraint:
    """What the output must match: a JSON schema, a regular expression or an EBNF grammar
    (GBNF, as llama.cpp writes it, with a ``root`` rule), by its text."""

    kind: Kind
    text: str


def constraint_of(params: SamplingParams) -> Constraint | None:
    """The request's constraint, or None for free output (``SamplingParams`` allows one)."""
    for kind in ("json_schema", "regex", "ebnf"):
        text = getattr(params, kind)
        if text is not None:
            return Constraint(kind, text)  # type: ignore[arg-type]
    return None


class GrammarCompiler:
    """Compiles constraints for one model; each text once (a dict keyed by the constraint),
    since compiling a JSON schema costs milliseconds to seconds and clients repeat theirs."""

    def __init__(self, tokenizer: Any, vocab_size: int):
        import xgrammar

        # vocab_size: the logits' width, which may exceed the tokenizer's (padding rows)
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.vocab_size = vocab_size
        self._compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        self._compiled: Dict[Constraint, xgrammar.CompiledGrammar] = {}

    def compile(self, constraint: Constraint) -> xgrammar.CompiledGrammar:
        """The compiled grammar; a ValueError with xgrammar's own message when it cannot be."""
        if constraint not in self._compiled:
            self._compiled[constraint] = self._compile(constraint)
        return self._compiled[constraint]

    def _compile(self, constraint: Constraint) -> xgrammar.CompiledGrammar:
        # JSON without free whitespace: else a weak model may spend max_tokens on spaces
        json_schema = partial(self._compiler.compile_json_schema, any_whitespace=False)
        compile_kind = {
            "json_schema": json_schema,
            "regex": self._compiler.compile_regex,
            "ebnf": self._compiler.compile_grammar,
        }[constraint.kind]
        try:
            compiled = compile_kind(constraint.text)
        except Exception as error:  # xgrammar raises RuntimeError or its own types
            raise ValueError(f"{constraint.kind} cannot be compiled: {_message(error)}") from None
        if not RequestGrammar(compiled, self.vocab_size).allows_any():
            raise ValueError(f"{constraint.kind} accepts no text: no token can start it")
        return compiled

    def matcher(self, constraint: Constraint) -> RequestGrammar:
        return RequestGrammar(self.compile(constraint), self.vocab_size)


class RequestGrammar:
    """One request's place in its grammar: the matcher has accepted ``accepted`` of the
    request's output tokens, in order."""

    def __init__(self, compiled: xgrammar.CompiledGrammar, vocab_size: int):
        import xgrammar

        self._matcher = xgrammar.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.accepted = 0

    def behind(self, output_ids: List[int], in_flight: int | None = None) -> List[int]:
        """The tokens of ``output_ids`` (then ``in_flight``, if any) not accepted yet."""
        tokens = output_ids[self.accepted :]
        return tokens if in_flight is None else tokens + [in_flight]

    def catch_up(self, output_ids: List[int]) -> None:
        """Accept the output tokens the matcher has not seen."""
        self.accept(output_ids[self.accepted :])

    def accept(self, tokens: List[int]) -> None:
        """Accept the tokens that follow the ``accepted`` ones. A token the grammar refuses is a
        bug of the mask (it was sampled under it), so it raises rather than being skipped."""
        for token in tokens:
            if self.is_terminated:
                break  # tokens after the grammar's end (an EOS ignored): nothing to follow
            if not self._matcher.accept_token(token):
                raise RuntimeError(f"token {token} breaks the grammar: the mask let it through")
            self.accepted += 1

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token accepted: the request ends here."""
        return self._matcher.is_terminated()

    def allows_any(self) -> bool:
        """Some token may come next (a grammar of no sentence at all allows none)."""
        import xgrammar

        bitmask = xgrammar.allocate_token_bitmask(1, self.vocab_size)
        self.fill(bitmask, 0)
        words = bitmask[0].tolist()
        if self.vocab_size % 32:  # past the vocabulary xgrammar may leave bits set: not tokens
            words[-1] &= (1 << self.vocab_size % 32) - 1
        return any(words)

    @property
    def matcher(self) -> xgrammar.GrammarMatcher:
        return self._matcher

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Row ``row`` of ``bitmask`` (int32, 32 tokens a word, on the host): the tokens the
        grammar allows next."""
        self._matcher.fill_next_token_bitmask(bitmask, row)


def catch_up_all(behind: Sequence[Tuple[RequestGrammar, List[int]]]) -> None:
    """Each grammar accepts its tokens not yet accepted (``RequestGrammar.behind``). Those one
    token behind, a decode step's usual case, take it in one xgrammar call for all of them, not
    a Python call each; the others accept theirs one at a time."""
    import xgrammar

    one = [(g, tokens[0]) for g, tokens in behind if len(tokens) == 1 and not g.is_terminated]
    for grammar, tokens in behind:
        if len(tokens) != 1:
            grammar.accept(tokens)
    if not one:
        return
    matchers = [g.matcher for g, _ in one]
    accepted = xgrammar.BatchGrammarMatcher.batch_accept_token(matchers, [t for _, t in one])
    for (grammar, token), ok in zip(one, accepted):
        if not ok:
            raise RuntimeError(f"token {token} breaks the grammar: the mask let it through")
        grammar.accepted += 1


def _message(error: Exception) -> str:
    """xgrammar's message without the time and source line it starts with."""
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(error).strip())
