"""Speculative decoding: cheap drafts of the next k tokens, all checked by the
target model in one forward, and kept as far as the target agrees."""

from __future__ import annotations

from .draft import DraftModel
from .ngram import NgramDrafter, propose_ngram
from .verify import accept_batch, accept_greedy, accept_sampled

__all__ = [
    "DraftModel",
    "NgramDrafter",
    "accept_batch",
    "accept_greedy",
    "accept_sampled",
    "propose_ngram",
]
