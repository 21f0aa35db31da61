"""Speculative decoding: cheap drafts of the next k tokens, all checked by the
target model in one forward, and kept as far as the target agrees."""

from __future__ import annotations

from .draft import DraftModel
from .ngram import NgramDrafter, NgramIndex, propose_ngram
from .rule import DraftRule
from .verify import accept_batch, accept_greedy, accept_sampled

__all__ = [
    "DraftModel",
    "DraftRule",
    "NgramDrafter",
    "NgramIndex",
    "accept_batch",
    "accept_greedy",
    "accept_sampled",
    "propose_ngram",
]
