"""Chapter 6's figure: batch_layout.svg, the first two batches Engine.prepare_batch lays out."""

from __future__ import annotations

import matplotlib.pyplot as plt

from .common import COLORS, LIGHT, box, diagram, figure, run_main


@figure("ch06", "batch_layout")
def batch_layout() -> plt.Figure:
    """The first two batches Engine.prepare_batch laid out in the ch06 main: each request's
    new tokens one after another, with their positions and KV slots (out_loc)."""
    import torch

    from minisgl.engine.engine import Engine

    batches = []
    real = Engine.prepare_batch

    def prepare_batch(self, batch):
        real(self, batch)
        ends = torch.tensor([r.extend_len for r in batch.reqs]).cumsum(0).tolist()
        batches.append(
            (
                batch.phase,
                [r.uid for r in batch.reqs for _ in range(r.extend_len)],
                batch.input_ids.tolist(),
                batch.positions.tolist(),
                batch.out_loc.tolist(),
                [e - 1 for e in ends],
            )
        )

    Engine.prepare_batch = prepare_batch
    try:
        run_main("ch06_engine.py")
    finally:
        Engine.prepare_batch = real
    shown = batches[:2]
    width = max(len(b[1]) for b in shown)
    fig, ax = plt.subplots(figsize=(12, 5.2), layout="constrained")
    diagram(ax, width + 3, 10.5)
    fig.suptitle("One batch, one flat row of tokens: the chapter 6 main's first two forwards")
    for number, (phase, uids, ids, positions, out_loc, last) in enumerate(shown):
        top = number * 5.5
        ax.text(
            0,
            top + 0.3,
            f"step {number}: {phase}, T = {len(uids)} tokens",
            va="center",
            fontweight="bold",
        )
        for row, (label, values) in enumerate(
            (("input_ids", ids), ("positions", positions), ("out_loc", out_loc))
        ):
            y = top + 1 + row
            ax.text(2.9, y + 0.5, label, ha="right", va="center")
            for i, (uid, value) in enumerate(zip(uids, values)):
                box(
                    ax,
                    3 + i,
                    y,
                    1,
                    1,
                    COLORS[uid] if row else LIGHT,
                    str(value),
                    color="white" if row else "black",
                    fontsize=8,
                )
        for i in last:
            ax.text(3 + i + 0.5, top + 4.3, "▲", ha="center", color=COLORS[uids[i]])
        ax.text(2.9, top + 4.4, "sampled", ha="right", va="center", fontsize=10)
    for uid in sorted(set(shown[0][1])):
        box(ax, 3 + 5 * uid, 10.8 - 0.6, 0.8, 0.6, COLORS[uid])
        ax.text(3.9 + 5 * uid, 10.5, f"request {uid}", va="center", fontsize=10)
    return fig
