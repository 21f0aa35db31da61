"""Chapter 24's figure: acceptance.svg, the tokens a request gets per target forward against how
often the target keeps a draft, measured by the engine on the tiny Llama 3 with the main's
noisy copies of it as draft models (k = 2, 4, 8), beside the formula for independent drafts."""

from __future__ import annotations

import datetime
import tempfile
from dataclasses import dataclass
from typing import List

import matplotlib.pyplot as plt

from .common import COLORS, ROOT, figure, quietly, tiny_model

LABEL_GREY = "#666666"  # darker than GREY: the labels sit on the points' colours

KS = (2, 4, 8)
NOISE = (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)  # 0: the target is its own draft
# 45 decode tokens a request after the prefill's one: a multiple of 3, 5 and 9, so that at
# full acceptance every step keeps k + 1 and max_tokens never shortens the last one's drafts
MAX_TOKENS = 46
LABELLED = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0)  # the noise scales named in the figure
# the figure's points, written each time it is drawn, for the text to quote from
POINTS = ROOT / "benchmark/results/speculative_acceptance_cpu.txt"


@dataclass
class Point:
    noise: float
    k: int
    kept_fraction: float  # drafts kept over drafts proposed: the main's percentage
    per_draft: float  # drafts kept over drafts the target reached (all before them kept)
    tokens_per_step: float
    accepted: int
    proposed: int
    reached: int
    steps: int  # request-steps of the verify forwards


def measure(target: str, draft: str, k: int, noise: float, base: List[List[int]]) -> Point:
    """One engine run with ``draft`` as the draft model: its statistics, and how many drafts
    the target reached (a draft behind a refused one is proposed but never compared)."""
    import ch24_speculative as m

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    llm = quietly(
        LLM,
        target,
        device="cpu",
        page_size=4,
        num_pages=128,
        speculative="draft",
        draft_model=draft,
        speculative_k=k,
        speculative_min_tokens=0.0,  # every step drafts: the curve, not the rule
    )
    speculator = llm.scheduler.speculator
    reached = 0
    decode = speculator.decode

    def counting(batch, constrained, mask):
        nonlocal reached
        runs, ran = decode(batch, constrained, mask)
        reached += sum(min(len(run), n - 1) for run, n in zip(runs, ran))
        return runs, ran

    speculator.decode = counting
    outs = llm.generate(m.PROMPTS, SamplingParams(max_tokens=MAX_TOKENS))
    if [out["token_ids"] for out in outs] != base:
        raise AssertionError(f"noise {noise}, k={k}: greedy tokens differ from no drafts")
    s = speculator.stats
    return Point(
        noise,
        k,
        s.acceptance,
        s.accepted / reached,
        s.tokens_per_step,
        s.accepted,
        s.proposed,
        reached,
        s.steps,
    )


def write_points(points: List[Point]) -> None:
    """The points as a table, dated, with what the formula gives at each one's a and k."""
    import torch
    from ch24_speculative import expected_tokens

    lines = [
        f"# tools/figurelib/ch24.py (python tools/figures.py ch24) on chapter 24's tree, drawn"
        f" {datetime.date.today().isoformat()}, torch {torch.__version__}, on a CPU",
        f"# tiny Llama 3, 3 prompts (the main's), greedy, {MAX_TOKENS} tokens each; drafts from"
        " noisy_copy(target, noise); rule off (speculative_min_tokens=0)",
        "# kept = drafts kept / proposed; a = kept / reached; tokens = (kept + steps) / steps;"
        " formula = (1 - a^(k+1)) / (1 - a)",
        "noise  k  kept proposed reached steps  kept%      a  tokens  formula  tokens/formula",
    ]
    for p in points:
        formula = expected_tokens(p.per_draft, p.k)
        lines.append(
            f"{p.noise:5g} {p.k:2d} {p.accepted:5d} {p.proposed:8d} {p.reached:7d} {p.steps:5d}"
            f" {p.kept_fraction:6.1%} {p.per_draft:6.3f} {p.tokens_per_step:7.2f}"
            f" {formula:8.2f} {p.tokens_per_step / formula - 1:+15.1%}"
        )
    POINTS.write_text("\n".join(lines) + "\n", encoding="utf-8")


def sweep() -> List[Point]:
    import ch24_speculative as m

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    points = []
    with tempfile.TemporaryDirectory() as tmp:
        target = tiny_model("llama3", tmp)
        plain = quietly(LLM, target, device="cpu", page_size=4, num_pages=128)
        outs = plain.generate(m.PROMPTS, SamplingParams(max_tokens=MAX_TOKENS))
        base = [out["token_ids"] for out in outs]
        for noise in NOISE:
            draft = m.noisy_copy(target, f"{tmp}/noise_{noise}", noise)
            points += [measure(target, draft, k, noise, base) for k in KS]
    return points


@figure("ch24", "acceptance")
def acceptance() -> plt.Figure:
    """Two panels of the same runs: against the fraction of drafts kept (what the main
    prints), and against the chance that a draft the target reaches is kept (the formula's a),
    where the formula's curves and the bound k + 1 are drawn."""
    from ch24_speculative import expected_tokens  # the main's formula, as it prints it

    points = sweep()
    write_points(points)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 5.4), layout="constrained", sharey=True)
    fig.suptitle(
        f"Tokens per target forward, tiny Llama 3 with noisy copies of itself as "
        f"drafts (3 prompts, greedy, {MAX_TOKENS} tokens each)",
        fontsize=11,
    )
    grid = [i / 200 for i in range(200)]
    for k, color in zip(KS, COLORS):
        mine = [p for p in points if p.k == k]
        for ax, x in (
            (left, [p.kept_fraction for p in mine]),
            (right, [p.per_draft for p in mine]),
        ):
            ax.plot(
                x,
                [p.tokens_per_step for p in mine],
                "o",
                color=color,
                label=f"k = {k}" if ax is left else None,
            )
            ax.axhline(k + 1, color=color, linewidth=0.8, linestyle=":")
        right.plot(
            grid + [1.0],
            [expected_tokens(a, k) for a in grid + [1.0]],
            color=color,
            linewidth=1.2,
            label=f"(1 - a^{k + 1}) / (1 - a), k = {k}",
        )
        right.text(0.01, k + 1.08, f"k + 1 = {k + 1}", color=color, fontsize=8)
    for p in points:
        if p.k == KS[-1] and p.noise in LABELLED:  # name the draft beside its k = 8 point
            right.annotate(
                f"{p.noise:g}",
                (p.per_draft, p.tokens_per_step),
                fontsize=8,
                color=LABEL_GREY,
                xytext=(6, -13),
                textcoords="offset points",
            )
    left.set_title("against drafts kept / drafts proposed (the main's %)", fontsize=10)
    right.set_title("against a = drafts kept / drafts the target reached", fontsize=10)
    left.set_ylabel("tokens a request gets per target forward")
    for ax in (left, right):
        ax.set_xlim(-0.02, 1.04)
        ax.set_ylim(0.8, max(KS) + 1.6)
        ax.set_xlabel("acceptance")
        ax.grid(alpha=0.3)
    left.legend(loc="upper left", fontsize=8)
    right.legend(loc="upper left", fontsize=8, bbox_to_anchor=(0.0, 0.86))
    right.text(
        1.0,
        1.0,
        "grey: the noise scale of the k = 8 draft",
        ha="right",
        fontsize=8,
        color=LABEL_GREY,
    )
    return fig
