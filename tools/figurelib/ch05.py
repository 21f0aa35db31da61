"""Chapter 5's figure: page_table.svg, the main's request through its page-table row into the
pool of pages.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .common import COLORS, GREY, LIGHT, arrow, box, diagram, figure, run_main


@figure("ch05", "page_table")
def page_table() -> plt.Figure:
    """The ch05 main's request at its end: each position's slot (its page-table row) and where
    that slot sits in the pool of pages."""
    main = run_main("ch05_kvcache.py")
    size, num_pages, req = main["PAGE_SIZE"], main["NUM_PAGES"], main["req"]
    slots = main["ctx"].page_table[req.table_idx, : req.cached_len].tolist()
    prompt_len = len(req.input_ids)
    total = num_pages * size
    pool_y = 7  # the pool's row; above it the request: positions, slots, each step's out_loc
    fig, ax = plt.subplots(figsize=(12, 5.1), layout="constrained")
    diagram(ax, total + 1, pool_y + 3.2)
    fig.suptitle("The paged KV cache at the end of the chapter 5 main")
    offset = (total - len(slots)) / 2  # the request's positions, centred above the pool
    ax.text(offset - 0.3, 0.5, "position", ha="right", va="center")
    ax.text(offset - 0.3, 1.5, "page table\nrow 0 (slot)", ha="right", va="center")
    holder = {}  # physical page -> the request's page index (its positions // size)
    for pos, slot in enumerate(slots):
        color = COLORS[pos // size]  # one colour per page of the request
        holder[slot // size] = pos // size
        box(ax, offset + pos, 0, 1, 1, color, str(pos), color="white")
        box(ax, offset + pos, 1, 1, 1, LIGHT, str(slot), fontsize=9)
        if pos % size == 0:
            arrow(ax, (offset + pos + size / 2, 3.1), (slot + size / 2, pool_y - 0.1), color=color)
    # a step's out_loc is its positions' slots: the prefill's all of the prompt's, a decode's one
    ax.text(offset - 0.3, 2.5, "each step's\nout_loc", ha="right", va="center")
    prefill = ", ".join(str(s) for s in slots[:prompt_len])
    box(ax, offset, 2, prompt_len, 1, GREY, f"prefill: [{prefill}]", fontsize=9)
    for pos in range(prompt_len, len(slots)):
        box(ax, offset + pos, 2, 1, 1, GREY, f"[{slots[pos]}]", fontsize=8)
    ax.text(
        offset,
        -0.4,
        f"prompt: positions 0–{prompt_len - 1}, then one decoded token a "
        f"step, up to {len(slots) - 1}",
        fontsize=10,
    )
    used = {slot: pos for pos, slot in enumerate(slots)}
    ax.text(-0.2, pool_y - 0.1, "KV pool", ha="left", va="bottom", fontweight="bold")
    for page in range(num_pages):
        held = page in holder
        color = COLORS[holder[page]] if held else GREY
        ax.text(
            page * size + size / 2,
            pool_y + 1.9,
            f"page {page}" + ("" if held else " (free)"),
            ha="center",
            va="top",
            fontsize=10,
        )
        for slot in range(page * size, (page + 1) * size):
            box(
                ax,
                slot,
                pool_y,
                1,
                1,
                color if slot in used else LIGHT,
                f"p{used[slot]}" if slot in used else "",
                color="white",
                fontsize=8,
            )
            ax.text(
                slot + 0.5,
                pool_y + 1.3,
                str(slot),
                ha="center",
                va="center",
                fontsize=7,
                color="#666666",
            )
    ax.text(
        total / 2,
        pool_y + 2.8,
        f"slot = page × {size} + offset; the pages came from a shuffled "
        "free list, so they are not next to each other",
        ha="center",
        fontsize=10,
    )
    return fig
