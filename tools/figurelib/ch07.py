"""Chapter 7's figure: schedule.svg, the main's continuous batching step by step, with the pages
in use.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from .common import COLORS, GREY, PHASE_COLORS, Step, figure, run_main, timeline


@figure("ch07", "schedule")
def schedule() -> plt.Figure:
    """The ch07 main's run: which request each step ran, and the pages in use after it."""
    steps: list[list[Step]] = []
    main = run_main("ch07_scheduler.py", steps)
    run, num_pages = steps[0], main["config"].num_pages
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(12, 6.4), height_ratios=[2.2, 1], sharex=True, layout="constrained"
    )
    fig.suptitle(
        f"Continuous batching in the chapter 7 main: 6 requests, 3 rows, {num_pages} pages"
    )
    timeline(top, run)
    top.set_title(
        "P prefill (tokens run), D decode, * last token, w waiting, · running but not in the batch",
        loc="left",
        fontsize=10,
    )
    colors = [PHASE_COLORS[s.phase] for s in run]
    xs = [x + 0.5 for x in range(len(run))]
    used = [s.pages_used for s in run]
    bottom.bar(xs, used, width=0.7, color=colors)
    # on top of each bar, what the running requests may still take: admission promised it
    bottom.bar(
        xs,
        [s.pages_reserved for s in run],
        bottom=used,
        width=0.7,
        color="white",
        edgecolor=GREY,
        hatch="//",
    )
    legend = [
        Patch(color=PHASE_COLORS["prefill"], label="used, after a prefill"),
        Patch(color=PHASE_COLORS["decode"], label="used, after a decode"),
        Patch(facecolor="white", edgecolor=GREY, hatch="//", label="reserved: running requests"),
    ]
    bottom.legend(handles=legend, loc="upper right", fontsize=9, frameon=False, ncol=3)
    bottom.axhline(num_pages, color=COLORS[3], linestyle="--")
    bottom.text(0.05, num_pages, f"the pool: {num_pages} pages", va="bottom", color=COLORS[3])
    bottom.set_ylim(0, num_pages + 3)
    bottom.set_ylabel("pages after\nthe step")
    bottom.set_xlabel("step")
    bottom.spines[["top", "right"]].set_visible(False)
    return fig
