"""Chapter 1's figure: tp_split.svg, the MLP's weights split over two tensor-parallel ranks
(the local shapes minisgl's linear layers take).
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .common import COLORS, arrow, box, diagram, figure, run_main


@figure("ch01", "tp_split")
def tp_split() -> plt.Figure:
    """The MLP's gate_up (column parallel) and down (row parallel) weights on two ranks, with
    the local shapes minisgl's linear layers take when get_tp_info says size 2."""
    import minisgl.layers.linear as linear
    from minisgl.utils.misc import TPInfo

    main = run_main("ch01_layers.py")
    H, FFN, TP = main["H"], main["FFN"], 2  # the main's hidden and intermediate sizes
    real = linear.get_tp_info
    linear.get_tp_info = lambda: TPInfo(rank=0, size=TP)  # what chapter 19 will return
    try:
        gate_up = linear.LinearColParallelMerged(H, [FFN, FFN])
        down = linear.LinearRowParallel(FFN, H)
    finally:
        linear.get_tp_info = real
    local_i = gate_up.output_sizes[0]  # each rank's slice of gate, and of up
    down_in = down.weight.shape[1]  # each rank's slice of down's input features

    fig, (left, right) = plt.subplots(
        1, 2, figsize=(12, 5.6), width_ratios=[1, 1.2], layout="constrained"
    )
    fig.suptitle(f"Tensor parallelism over {TP} ranks: the MLP of a {H}-wide model")
    W = 80  # drawn width of a weight (the H input columns)
    diagram(left, 330, 2 * FFN + 40)
    left.set_title(f"gate_up_proj, column parallel: full weight [{2 * FFN}, {H}]")
    for part, name in enumerate(("gate", "up")):
        for rank in range(TP):
            y = part * FFN + rank * local_i
            box(
                left,
                0,
                y,
                W,
                local_i,
                COLORS[rank],
                f"{name}\nrows {rank * local_i}–{(rank + 1) * local_i - 1}",
                color="white",
                fontsize=10,
            )
    for rank in range(TP):
        y0 = rank * (FFN + 20)
        shape = list(gate_up.weight.shape)
        box(left, 190, y0, W, local_i, COLORS[rank], "gate", color="white")
        box(left, 190, y0 + local_i, W, local_i, COLORS[rank], "up", color="white")
        left.text(190 + W + 8, y0 + local_i, f"rank {rank}\nholds\n{shape}", va="center")
        for part in range(2):
            src = part * FFN + rank * local_i + local_i / 2
            arrow(left, (W + 4, src), (186, y0 + part * local_i + local_i / 2), color=COLORS[rank])
    left.text(
        0,
        2 * FFN + 30,
        "each rank: silu(gate) * up on its own slice, no communication",
        fontsize=10,
    )

    diagram(right, 420, 2 * FFN + 40)
    right.set_title(f"down_proj, row parallel: full weight [{H}, {FFN}]")
    for rank in range(TP):
        box(
            right,
            rank * 1.4 * down_in,
            0,
            1.4 * down_in,
            H,
            COLORS[rank],
            f"rank {rank}\ncolumns\n{rank * down_in}–{(rank + 1) * down_in - 1}",
            color="white",
            fontsize=10,
        )
    right.text(
        2.8 * down_in + 10, H / 2, f"each rank holds\n{list(down.weight.shape)}", va="center"
    )
    for rank in range(TP):
        y = 105 + rank * 40
        right.text(
            0,
            y,
            f"rank {rank}:  h{rank} [T, {down_in}] @ W{rank}ᵀ  →  partial y{rank}",
            va="center",
            color=COLORS[rank],
        )
        arrow(right, (300, y), (328, 125))
    right.text(
        332,
        125,
        "all-reduce\ny = y0 + y1\n[T, {H}]".replace("{H}", str(H)),
        va="center",
        fontweight="bold",
    )
    right.text(
        0,
        215,
        "One all-reduce per MLP (and one per attention block, after o_proj):\n"
        "the partial sums are added across the ranks (chapter 19).",
        fontsize=10,
    )
    return fig
