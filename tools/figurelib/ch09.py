"""Chapter 9's figure: chunks.svg, the prompt tokens each request runs a step under the prefill
budget.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from .common import COLORS, Step, figure, run_main


@figure("ch09", "chunks")
def chunks() -> plt.Figure:
    """The ch09 main's first run: the prompt tokens each request ran in each step, under its
    budget a prefill."""
    steps: list[list[Step]] = []
    main = run_main("ch09_chunked.py", steps)
    run = steps[0]
    budget = run[0].budget
    prompts = [len(p) for p in main["prompts"]]
    fig, ax = plt.subplots(figsize=(12, 4.8), layout="constrained")
    fig.suptitle(
        f"Chunked prefill in the chapter 9 main: prompts of {prompts} tokens, "
        f"a budget of {budget} a prefill"
    )
    for x, step in enumerate(run):
        bottom = 0
        for uid, n in step.ran.items():
            ax.bar(
                x,
                n,
                bottom=bottom,
                color=COLORS[uid],
                edgecolor="white",
                hatch="" if step.phase == "prefill" else "//",
            )
            ax.text(x, bottom + n / 2, f"{n}", ha="center", va="center", color="white")
            bottom += n
        for i, uid in enumerate(step.sampled):
            ax.text(
                x,
                bottom + 0.3 + 0.6 * i,
                f"token → {uid}",
                ha="center",
                fontsize=8,
                color=COLORS[uid],
            )
    ax.axhline(budget, color=COLORS[3], linestyle="--")
    ax.text(
        len(run) - 0.5, budget + 0.1, f"budget {budget}", ha="right", va="bottom", color=COLORS[3]
    )
    ax.set_xticks(range(len(run)), [f"{x}\n{s.phase}" for x, s in enumerate(run)])
    ax.set_ylabel("tokens run in the step")
    ax.set_ylim(0, budget + 3)
    handles = [Rectangle((0, 0), 1, 1, color=COLORS[u]) for u in range(len(prompts))]
    ax.legend(
        handles,
        [f"request {u} ({n} prompt tokens)" for u, n in enumerate(prompts)],
        loc="upper right",
    )
    ax.spines[["top", "right"]].set_visible(False)
    return fig
