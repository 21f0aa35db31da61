"""Which draft tokens the target model keeps: exact for greedy decoding, and for
sampling the rule that leaves the target's distribution as it was."""

from __future__ import annotations

from typing import List, Sequence

import torch


def accept_greedy(drafts: Sequence[int], target_ids: Sequence[int]) -> List[int]:
    """The run a greedy request keeps: the drafts as long as each is the target's argmax
    after the tokens before it, then the target's own next token. ``target_ids``: the
    argmax at each of the ``len(drafts) + 1`` positions verified. The run is what greedy
    decoding without drafts gives, one to ``len(drafts) + 1`` tokens of it."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == target_ids[accepted]:
        accepted += 1
    return list(target_ids[: accepted + 1])


def accept_sampled(
    drafts: Sequence[int],
    target_probs: torch.Tensor,
    generator: torch.Generator,
    draft_probs: torch.Tensor | None = None,
) -> List[int]:
    """The run a sampling request keeps, by the rule of speculative sampling (Leviathan et
    al., Chen et al., 2023): draft x_i, proposed with probability q_i(x_i), is kept with
    probability min(1, p_i(x_i) / q_i(x_i)); the first one refused is replaced by a draw from
    the leftover max(p_i - q_i, 0), renormalised; if all are kept, one more token is drawn from
    p_{k+1}. Every token then comes from the target's p, exactly as without drafts.

    target_probs: [k + 1, V], p at each position verified (after temperature, top-k, top-p);
    draft_probs: [k, V], q; None for drafts proposed deterministically (n-grams, a greedy
    draft model), whose q_i is all on x_i: then x_i is kept with probability p_i(x_i)."""
    run: List[int] = []
    for i, token in enumerate(drafts):
        p = target_probs[i]
        q = _one_hot(token, p) if draft_probs is None else draft_probs[i]
        if torch.rand((), generator=generator) * q[token] < p[token]:
            run.append(token)
            continue
        leftover = (p - q).clamp_min(0.0)  # not all zero: p(x) < q(x) for this x
        run.append(_draw(leftover, generator))
        return run
    run.append(_draw(target_probs[len(drafts)], generator))
    return run


def _one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    q = torch.zeros_like(like)
    q[token] = 1.0
    return q


def _draw(weights: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(weights / weights.sum(), 1, generator=generator))
