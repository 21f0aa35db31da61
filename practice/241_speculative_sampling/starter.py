"""Exercise 241: which draft tokens a target model keeps, greedy and by speculative sampling."""

from __future__ import annotations

from typing import Callable


def accept_greedy(drafts: list[int], target_ids: list[int]) -> list[int]:
    """The drafts as long as each is the target's argmax at its position, then the target's
    own next token: 1 to len(drafts) + 1 tokens."""
    raise NotImplementedError


def accept_sampled(
    drafts: list[int],
    target_probs: list[list[float]],
    draft_probs: list[list[float]] | None,
    uniforms: list[float],
    draw: Callable[[list[float]], int],
) -> list[int]:
    """Draft i kept with probability min(1, p_i(x_i) / q_i(x_i)), decided by uniforms[i]; the
    first refused replaced by a draw from max(p_i - q_i, 0) renormalised; all kept, one more
    token drawn from p_k. draft_probs None: each q_i all on x_i."""
    raise NotImplementedError
