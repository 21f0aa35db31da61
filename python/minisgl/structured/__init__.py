"""Structured output: constraints compiled by xgrammar, a matcher per request and
a token bitmask per constrained row of the logits."""

from .grammar import Constraint, GrammarCompiler, RequestGrammar, catch_up_all, constraint_of
from .mask import apply_bitmask, fill_bitmask

__all__ = [
    "Constraint",
    "GrammarCompiler",
    "RequestGrammar",
    "apply_bitmask",
    "catch_up_all",
    "constraint_of",
    "fill_bitmask",
]
