"""Breaks: Neither function changes its inputs."""

from __future__ import annotations

from typing import Callable


def accept_greedy(drafts: list[int], target_ids: list[int]) -> list[int]:
    """The drafts as long as each is the target's argmax at its position, then the target's
    own next token: 1 to len(drafts) + 1 tokens."""
    kept = 0
    while kept < len(drafts) and drafts[kept] == target_ids[kept]:
        kept += 1
    return list(target_ids[: kept + 1])  # the last is the target's own, where a draft failed


def accept_sampled(
    drafts: list[int],
    target_probs: list[list[float]],
    draft_probs: list[list[float]] | None,
    uniforms: list[float],
    draw: Callable[[list[float]], int],
) -> list[int]:
    """Draft i kept when uniforms[i] < p_i(x_i) / q_i(x_i); the first refused replaced by a
    draw from max(p_i - q_i, 0) renormalised; all kept, one more drawn from p_k."""
    run: list[int] = []
    for i, token in enumerate(drafts):
        p = target_probs[i]
        q = one_hot(token, len(p)) if draft_probs is None else draft_probs[i]
        if uniforms[i] * q[token] < p[token]:  # probability min(1, p/q): uniforms are < 1
            run.append(token)
            continue
        # refused means p(x) < q(x), so the leftover holds at least q(x) - p(x) > 0
        p[:] = [max(pt - qt, 0.0) for pt, qt in zip(p, q)]  # no copy: p is not needed again
        leftover = p
        run.append(draw(normalised(leftover)))
        return run
    run.append(draw(list(target_probs[len(drafts)])))  # every draft kept: the bonus token
    return run


def one_hot(token: int, size: int) -> list[float]:
    """A deterministic draft's q: all of it on the token proposed."""
    q = [0.0] * size
    q[token] = 1.0
    return q


def normalised(weights: list[float]) -> list[float]:
    total = sum(weights)
    return [w / total for w in weights]
