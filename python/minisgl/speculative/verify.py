"""Which draft tokens the target model keeps: exact for greedy decoding, and for
sampling the rule that leaves the target's distribution as it was."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate, chain
from typing import List, Sequence, Tuple

import torch

from minisgl.engine.sample import BatchSamplingArgs, top_k_top_p_filter


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


def accept_batch(
    logits: torch.Tensor,
    drafts: Sequence[Sequence[int]],
    args: BatchSamplingArgs,
    generator: torch.Generator | None = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Every request's run at once, on the logits' device: ``accept_greedy``'s rule for the
    greedy requests, ``accept_sampled``'s with ``draft_probs=None`` for the others (the drafts
    here are deterministic). No Python loop over requests or positions, but one over the
    requests that bring a seed.

    logits: [T, V] as the verify forward returns them, each request's ``len(draft) + 1`` rows in
    turn; drafts: each request's, 0 to k tokens; args: the requests' settings, one entry a
    request, ``row_seeds`` their own seeds (``row_seed``), None where the request has none;
    generator: the draws of the requests without a seed, on the logits' device.

    Returns runs [B, k + 1] int64, request b's run in its first ``lengths[b]`` entries (the rest
    repeats its last token), and lengths [B] int64, 1 to ``len(drafts[b]) + 1``."""
    layout = _Layout.of(drafts, logits.device)
    assert logits.shape[0] == layout.num_rows, (logits.shape, layout.num_rows)
    token = logits.argmax(dim=-1)  # each row's token: greedy's argmax, or the draw below
    keep = layout.draft == token  # each row's draft kept: greedy's test
    if not args.all_greedy:
        greedy = args.greedy[layout.request]
        sampled_keep, drawn = _sampled(logits, layout, args, generator)
        keep = torch.where(greedy, keep, sampled_keep)
        token = torch.where(greedy, token, drawn)
    return layout.runs(keep, token)


@dataclass
class _Layout:
    """Where each request's rows lie in the verify logits, as tensors on their device."""

    draft: torch.Tensor  # [T]: the draft each row verifies; -1 on a request's last row
    request: torch.Tensor  # [T]: the request each row belongs to
    rows: torch.Tensor  # [B, k + 1]: request b's j-th row, its last repeated past its end
    drafted: torch.Tensor  # [B, k + 1] bool: the request's j-th row verifies a draft
    bounds: List[int]  # on the host, B + 1: request b's rows are bounds[b] to bounds[b + 1]

    @property
    def num_rows(self) -> int:
        return self.draft.shape[0]

    @classmethod
    def of(cls, drafts: Sequence[Sequence[int]], device: torch.device) -> _Layout:
        lengths = [len(d) for d in drafts]
        values = [*chain.from_iterable((*d, -1) for d in drafts), *lengths]
        # one host-to-device copy, from pinned memory on a GPU (it need not wait for the queue)
        host = torch.tensor(values, dtype=torch.int64, pin_memory=device.type == "cuda")
        flat = host.to(device, non_blocking=True)
        num_rows = len(values) - len(lengths)
        draft, n = flat[:num_rows], flat[num_rows:]
        request = torch.repeat_interleave(
            torch.arange(len(drafts), device=device), n + 1, output_size=num_rows
        )
        j = torch.arange(max(lengths, default=0) + 1, device=device)
        first = (n + 1).cumsum(0) - (n + 1)
        return cls(
            draft=draft,
            request=request,
            rows=first[:, None] + torch.minimum(j, n[:, None]),
            drafted=j < n[:, None],
            bounds=list(accumulate((length + 1 for length in lengths), initial=0)),
        )

    def runs(self, keep: torch.Tensor, token: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """From each row's keep flag and token, the runs and their lengths: the drafts up to
        the first one refused, then the token of that row (of the last row, if none is)."""
        kept = (keep[self.rows] & self.drafted).long().cumprod(dim=1).sum(dim=1)  # [B]
        last = token[self.rows.gather(1, kept[:, None])]  # [B, 1]: the row after the kept
        before = torch.arange(self.rows.shape[1], device=kept.device) < kept[:, None]
        return torch.where(before, self.draft[self.rows], last), kept + 1


def _sampled(
    logits: torch.Tensor,
    layout: _Layout,
    args: BatchSamplingArgs,
    generator: torch.Generator | None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each row's keep flag and token by speculative sampling with a one-hot q: the draft x is
    kept when a uniform is below p(x); the token is a draw from p with x taken out (from p
    itself on a request's last row, which verifies no draft). p is the row's distribution after
    temperature, top-k and top-p, renormalised. Every row draws, greedy or not: one draw over
    all rows costs less than picking the sampled ones out."""
    request = layout.request
    probs = torch.softmax(logits.float() / args.temperatures[request, None], dim=-1)
    if args.any_filter:  # not renormalised: both tests below divide by the row's sum
        probs = top_k_top_p_filter(probs, args.top_k[request], args.top_p[request])
    drafted = layout.draft >= 0
    x = layout.draft.clamp_min(0)[:, None]  # token 0 on the last rows: nothing is taken out
    p_x = probs.gather(1, x).squeeze(1)
    leftover = probs.scatter_(1, x, torch.where(drafted, 0.0, p_x)[:, None])  # p is not reused
    cdf = leftover.cumsum(dim=-1)
    rest = cdf[:, -1]  # the mass besides x, before renormalising
    uniform = _uniforms(layout, args.row_seeds, generator)
    keep = uniform[:, 0] * (rest + torch.where(drafted, p_x, 0.0)) < p_x  # u < p(x) / sum(p)
    return keep, _inverse_cdf(cdf, uniform[:, 1])


def _inverse_cdf(cdf: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """A token of each row drawn with probability its weight over the row's sum: the first
    whose cumulative weight passes ``uniform`` times that sum. A token of weight 0 is never
    drawn, not even when the product rounds up to the sum. cdf: [T, V]; uniform: [T]."""
    total = cdf[:, -1:].contiguous()
    drawn = torch.searchsorted(cdf, uniform[:, None] * total, right=True)
    last = torch.searchsorted(cdf, total)  # the last token of weight above 0
    return torch.minimum(drawn, last).squeeze(1)


def _uniforms(
    layout: _Layout, row_seeds: Sequence[int | None], generator: torch.Generator | None
) -> torch.Tensor:
    """[T, 2]: each row's uniform for its keep test and for its draw. A request with a seed
    draws its own from a generator of its seed, so that the batch, its row and its neighbours
    cannot change its tokens; the others come from ``generator``."""
    device = layout.draft.device
    uniform = torch.rand(layout.num_rows, 2, device=device, generator=generator)
    for start, end, seed in zip(layout.bounds, layout.bounds[1:], row_seeds):
        if seed is not None:
            own = torch.Generator(device=device).manual_seed(seed)
            uniform[start:end] = torch.rand(end - start, 2, device=device, generator=own)
    return uniform


def _one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    q = torch.zeros_like(like)
    q[token] = 1.0
    return q


def _draw(weights: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(weights / weights.sum(), 1, generator=generator))
