"""Chapter 25's figure: loglikelihood.svg, a multiple-choice question scored as
lm-evaluation-harness scores it, by the engine's prompt log-probabilities (``echo``): each choice
is the context's tokens and its own, one request, and the four requests are one batch that the
engine runs in one forward. The real small model (SmolLM2-135M-Instruct), since a random-weight
model's log-probabilities say nothing about the answers."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from .common import COLORS, GREY, figure, quietly

CONTEXT = "Question: Who wrote the play Romeo and Juliet?\nAnswer:"
CHOICES = [" William Shakespeare", " Charles Dickens", " Jane Austen", " Mark Twain"]


def score(llm, context: list[int], choices: list[list[int]]) -> tuple[list, int]:
    """Each choice's prompt log-probabilities (a Logprobs over context + choice), and how many
    forwards the engine ran for the whole batch."""
    from minisgl.core import SamplingParams

    engine, forwards = llm.scheduler.engine, []
    model_forward = engine.model.forward

    def counted(*args, **kwargs):
        forwards.append(1)
        return model_forward(*args, **kwargs)

    engine.model.forward = counted
    try:
        params = SamplingParams(max_tokens=1, prompt_logprobs=1)
        results = llm.generate([context + c for c in choices], [params] * len(choices))
    finally:
        engine.model.forward = model_forward
    return [r["prompt_logprobs"] for r in results], len(forwards)


@figure("ch25", "loglikelihood")
def loglikelihood() -> plt.Figure:
    """Above, the best choice's prompt: a bar per token after the first, its log-probability
    from the row before it, the answer's tokens in colour. Below, each choice's loglikelihood
    (the sum over its own tokens) and whether each of its tokens was the likeliest there."""
    from real_model import cached_real_model

    from minisgl.llm import LLM

    llm = quietly(LLM, str(cached_real_model()), device="cpu", dtype=torch.float32)
    tok = llm.tokenizer
    context = tok.encode(CONTEXT)
    choices = [tok.encode(c) for c in CHOICES]
    runs, forwards = score(llm, context, choices)
    llm.shutdown()
    n = len(context)
    sums = [sum(lp.logprobs[n:]) for lp in runs]
    greedy = [all(t == top[0] for t, top in zip(lp.token_ids[n:], lp.top_ids[n:])) for lp in runs]
    best = max(range(len(sums)), key=sums.__getitem__)

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(12, 7.5), layout="constrained", height_ratios=[3, 2]
    )
    fig.suptitle(
        f"A multiple-choice question scored by prompt log-probabilities: {len(CHOICES)} "
        f"requests, one batch, {forwards} forward{'s' * (forwards != 1)} "
        "(SmolLM2-135M-Instruct, float32)",
        fontsize=12,
    )
    lp = runs[best]
    steps = range(1, len(lp))
    values = [lp.logprobs[i] for i in steps]
    top.bar(steps, values, color=[COLORS[0] if i >= n else GREY for i in steps])
    labels = [repr(tok.decode([lp.token_ids[i]]))[1:-1].replace(" ", "\u2423") for i in steps]
    top.set_xticks(list(steps), labels, rotation=90, fontsize=8, family="monospace")
    for i in range(n, len(lp)):  # what the model would have said there, from the same row
        likeliest = repr(tok.decode([lp.top_ids[i][0]]))
        top.annotate(
            f"{lp.logprobs[i]:.2f}\nlikeliest:\n{likeliest}\n{lp.top_logprobs[i][0]:.2f}",
            (i, lp.logprobs[i]),
            xytext=(0, -4),
            textcoords="offset points",
            ha="center",
            va="top",
            fontsize=8,
        )
    top.set_xlim(0.3, len(lp) - 0.3)
    top.set_ylim(min(values) - 2.5, 0.2)  # room under the answer's bars for their notes
    top.set_ylabel("log-probability")
    top.grid(alpha=0.3, axis="y")
    top.set_title(
        f"context + {CHOICES[best]!r}: {len(lp)} prompt tokens, an entry for each after the first "
        f"(grey: the context's {n - 1}; blue: the answer's {len(lp) - n})",
        fontsize=10,
        loc="left",
    )

    rows = range(len(CHOICES))
    bottom.barh(rows, sums, color=[COLORS[0] if i == best else GREY for i in rows])
    bottom.set_yticks(list(rows), [repr(c) for c in CHOICES], family="monospace")
    bottom.invert_yaxis()
    for i in rows:
        bottom.text(
            sums[i],
            i,
            f"  {sums[i]:.2f}" + ("  likeliest at every token" if greedy[i] else ""),
            va="center",
            ha="right" if sums[i] < 0 else "left",
            fontsize=9,
        )
    bottom.set_xlabel("loglikelihood: the sum of the choice's own tokens' log-probabilities")
    bottom.grid(alpha=0.3, axis="x")
    bottom.set_title(
        "the four choices: lm-evaluation-harness picks the largest", fontsize=10, loc="left"
    )
    return fig
