"""Log-probabilities from a forward's logits: of the token a request sampled, of each prompt
token after the first (echo), and the k most likely tokens at each of those positions.

A sampled token's log-probability is the log-softmax of the very row the sampler drew from,
after the grammar's mask, the request's logit bias and penalties, and before temperature, top-k
and top-p: the model's distribution as the request changed it, whatever the draw's settings.
A prompt token's is the log-softmax of the model's own logits at the position before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable, Dict, List, Sequence, Tuple

import torch

from minisgl.core import Logprobs, Req


@dataclass
class LogprobPlan:
    """Which logits rows of a batch report log-probabilities, decided on the host when the
    batch is prepared. Rows of the batch's logits: each request's last token's (its sampled
    row), and every prompt position of a request that asks its prompt's."""

    sampled: List[int]  # requests (batch indices) whose sampled token's log-probability is asked
    sampled_k: int  # the most alternatives they ask
    prompt_rows: List[int]  # logits rows scored against the prompt's next token
    prompt_targets: List[int]  # that token, one a row
    prompt_k: int
    prompt_spans: List[Tuple[int, int]]  # per echo request: (batch index, rows it scored)
    logits_rows: List[int] = field(default_factory=list)  # the batch's tokens whose logits run
    sample_rows: List[int] = field(default_factory=list)  # each request's row among them


def plan_logprobs(reqs: Sequence[Req], is_prefill: bool) -> LogprobPlan | None:
    """The batch's plan, or None when no request asks for log-probabilities (nothing changes
    then). In a prefill, a request that asks its prompt's gets the logits of every token it
    runs; position p is scored against prompt token p + 1, the last prompt position against the
    token sampled there, which is the sampled row's own business."""
    sampled = [i for i, r in enumerate(reqs) if r.sampling_params.logprobs is not None]
    echo = {i for i, r in enumerate(reqs) if r.needs_prompt_logits} if is_prefill else set()
    if not sampled and not echo:
        return None
    plan = LogprobPlan(
        sampled,
        max((reqs[i].sampling_params.logprobs or 0 for i in sampled), default=0),
        [],
        [],
        max((reqs[i].sampling_params.prompt_logprobs or 0 for i in echo), default=0),
        [],
    )
    offset = 0  # the request's first token among the batch's
    for i, req in enumerate(reqs):
        if i in echo:
            first = len(plan.logits_rows)
            plan.logits_rows.extend(range(offset, offset + req.extend_len))
            # positions cached_len .. with a prompt token after them
            scored = min(req.device_len, len(req.input_ids) - 1) - req.cached_len
            plan.prompt_rows.extend(range(first, first + scored))
            start = req.cached_len + 1
            plan.prompt_targets.extend(req.input_ids[start : start + scored])
            plan.prompt_spans.append((i, scored))
        else:
            plan.logits_rows.append(offset + req.extend_len - 1)
        plan.sample_rows.append(len(plan.logits_rows) - 1)
        offset += req.extend_len
    return plan


def gather_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, k: int
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [N, V], targets [N] -> the targets' log-probabilities [N] (float32), and the k
    largest log-probabilities [N, k] with their token ids [N, k], best first."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, targets[:, None]).squeeze(1)
    top = logprobs.topk(k, dim=-1)
    return chosen, top.values, top.indices


@dataclass
class DeviceLogprobs:
    """What a forward's plan reported, as tensors (on the device, then on the host): for the
    sampled rows and for the prompt rows, each row's target log-probability [N], and the top k's
    log-probabilities and ids [N, k]."""

    sampled: Tuple[torch.Tensor, ...] = ()
    prompt: Tuple[torch.Tensor, ...] = ()

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> DeviceLogprobs:
        return DeviceLogprobs(*(tuple(fn(t) for t in getattr(self, f.name)) for f in fields(self)))


def compute_logprobs(
    plan: LogprobPlan, logits: torch.Tensor, prompt_logits: torch.Tensor, tokens: torch.Tensor
) -> DeviceLogprobs:
    """The plan's log-probabilities: the sampled rows' from ``logits`` [B, V] (as the sampler
    drew from them) at ``tokens`` [B], the prompt rows' from the forward's own ``prompt_logits``.
    Nothing here waits for the device."""
    out = DeviceLogprobs()
    if plan.sampled:
        rows = _on(plan.sampled, logits.device)
        out.sampled = gather_logprobs(logits[rows], tokens[rows], plan.sampled_k)
    if plan.prompt_rows:
        rows = _on(plan.prompt_rows, logits.device)
        targets = _on(plan.prompt_targets, logits.device)
        out.prompt = gather_logprobs(prompt_logits[rows], targets, plan.prompt_k)
    return out


def _on(values: List[int], device: torch.device) -> torch.Tensor:
    host = torch.tensor(values, dtype=torch.long, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)  # pinned: the copy waits for nothing


@dataclass
class RequestLogprobs:
    """A batch's reported log-probabilities on the host, by request (batch index)."""

    prompt: Dict[int, Logprobs] = field(default_factory=dict)  # this chunk's prompt entries
    sampled: Dict[int, Entry] = field(default_factory=dict)  # the sampled token's entry


Entry = Tuple[float, List[Tuple[int, float]]]  # a log-probability, and [(id, logprob)] best first


def by_request(reqs: Sequence[Req], plan: LogprobPlan, host: DeviceLogprobs) -> RequestLogprobs:
    """The plan's numbers (on the host) sorted out by request, each cut to the alternatives
    its request asked for."""
    out = RequestLogprobs()
    if host.prompt:
        entries, start = _entries(*host.prompt), 0
        for i, count in plan.prompt_spans:
            k = reqs[i].sampling_params.prompt_logprobs or 0
            targets = plan.prompt_targets[start : start + count]
            out.prompt[i] = chunk = Logprobs()
            for token, (logprob, top) in zip(targets, entries[start : start + count]):
                chunk.append(token, logprob, top[:k])
            start += count
    if host.sampled:
        for i, (logprob, top) in zip(plan.sampled, _entries(*host.sampled)):
            out.sampled[i] = (logprob, top[: reqs[i].sampling_params.logprobs or 0])
    return out


def _entries(
    chosen: torch.Tensor, values: torch.Tensor, ids: torch.Tensor
) -> List[Tuple[float, List[Tuple[int, float]]]]:
    """Per row: the target's log-probability and [(id, logprob)] best first. A token of
    probability 0 (masked out by a grammar) is no alternative: -inf is left out."""
    return [
        (lp, [(t, v) for t, v in zip(row_ids, row_values) if v != float("-inf")])
        for lp, row_values, row_ids in zip(chosen.tolist(), values.tolist(), ids.tolist())
    ]
