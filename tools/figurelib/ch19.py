"""Chapter 19's figure: shards.svg, what each of two ranks holds and one forward's
collectives.
"""

from __future__ import annotations

import tempfile

import matplotlib.pyplot as plt

from .common import COLORS, GREY, LIGHT, box, diagram, figure, tiny_model


def rank_state(path: str, rank: int, size: int) -> dict:
    """The weights rank ``rank`` of ``size`` loads (no process group needed to load)."""
    from minisgl.distributed import set_tp_info
    from minisgl.models import load_model

    set_tp_info(rank, size)
    try:
        return load_model(path).state_dict()
    finally:
        set_tp_info(0, 1)


@figure("ch19", "shards")
def tp_shards() -> plt.Figure:
    """Left: the MLP's two matmuls over two ranks, drawn to scale from the shapes and contents of
    the tiny Llama 3's weights as each rank loads them with the chapter's shard(): gate_up cut
    by columns (Y = X A), down by rows (Z = Y B), each rank's partial sum, the all-reduce.
    Right: one forward's path on a rank, with its shapes and collectives."""
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_model("llama3", tmp)
        whole = rank_state(path, 0, 1)
        ranks = [rank_state(path, r, 2) for r in range(2)]
    names = ["embed_tokens", "qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"]
    keys = [next(k for k in whole if name in k) for name in names]
    gate_up, down = keys[3], keys[4]
    inter, hidden = whole[down].shape[1], whole[down].shape[0]  # I and H, stored [H, I]
    part = ranks[0][down].shape[1]  # each rank's I / 2
    for r, state in enumerate(ranks):  # rank r: its slice of gate, then its slice of up
        own = slice(r * part, (r + 1) * part)
        up = slice(inter + r * part, inter + (r + 1) * part)
        assert state[gate_up].shape == (2 * part, hidden)
        assert state[gate_up][:part].equal(whole[gate_up][own])
        assert state[gate_up][part:].equal(whole[gate_up][up])
        assert state[down].equal(whole[down][:, own])

    fig, (left, right) = plt.subplots(
        1, 2, figsize=(14, 6.4), width_ratios=[1.25, 1], layout="constrained"
    )
    total = sum(t.numel() for t in whole.values())
    held = sum(t.numel() for t in ranks[0].values())
    fig.suptitle(
        f"Two ranks: each holds {100 * held / total:.1f}% of the tiny Llama 3's "
        f"{total:,} weights (the norms whole on both)"
    )
    u = 0.2  # diagram units per element of a weight's side; a batch's T tokens drawn 5 high
    t_h, width, height = 5.0, 130.0, 100.0
    diagram(left, width, height)
    left.set_title(
        "The MLP's two matmuls, Megatron's Y = X A then Z = Y B, to scale (the tiny Llama 3)",
        fontsize=10,
    )
    rank_colour = [COLORS[0], COLORS[1]]

    def matrix(x, y, cols, rows, colours, label, below=True):
        """A [rows, cols] matrix at (x, y), cut into ``colours`` (a list of (size, colour,
        vertical)) and labelled; returns its right edge."""
        for offset, size, colour, vertical in colours:
            if vertical:  # a block of columns
                box(left, x + offset * u, y, size * u, rows, colour)
            else:  # a block of rows
                box(left, x, y + offset * u, cols * u, size * u, colour)
        ty = y + rows + 1.2 if below else y - 1.2
        left.text(
            x + cols * u / 2, ty, label, ha="center", va="top" if below else "bottom", fontsize=8
        )
        return x + cols * u

    # Y = X A: A (gate_up) cut by columns; rank r takes its slice of gate and its slice of up
    y0 = 13.0
    left.text(
        0,
        y0 - 7,
        "Column parallel: gate_up_proj, A = W.T [H, 2I], cut by its columns",
        fontsize=9,
        fontweight="bold",
    )
    x = matrix(
        1,
        y0 + (hidden * u - t_h) / 2,
        hidden,
        t_h,
        [(0, hidden, GREY, True)],
        f"X [T, {hidden}]\nwhole on both",
    )
    left.text(x + 1.5, y0 + hidden * u / 2, "·", ha="center", va="center", fontsize=16)
    blocks = [(i * part, part, rank_colour[i % 2], True) for i in range(4)]
    ax0 = x + 3
    x = matrix(
        ax0, y0, 2 * inter, hidden * u, blocks, f"A [{hidden}, {2 * inter}]: gate | up", below=True
    )
    for i, label in enumerate(["gate", "up"]):
        left.text(
            ax0 + (i * inter + inter / 2) * u, y0 - 0.8, label, ha="center", va="bottom", fontsize=8
        )
    left.text(x + 1.5, y0 + hidden * u / 2, "=", ha="center", va="center", fontsize=14)
    x = matrix(
        x + 3,
        y0 + (hidden * u - t_h) / 2,
        2 * inter,
        t_h,
        blocks,
        f"[T, {2 * inter}]: each rank\ncomputes its {2 * part} columns only",
    )
    left.text(
        1,
        y0 + hidden * u + 9,
        f"Rank r's A_r is its {part} gate columns and its {part} up columns: "
        f"{list(ranks[0][gate_up].shape)} stored, cut by shard() before the merge.\n"
        f"silu(gate) * up needs no other rank: Y_r = [T, {part}], rank r's columns of Y.",
        fontsize=8.5,
        va="top",
    )

    # Z = Y B: B (down) cut by rows, the same slice; partial sums, then the all-reduce
    y1 = 55.0
    left.text(
        0,
        y1 - 7,
        "Row parallel: down_proj, B = W.T [I, H], cut by its rows",
        fontsize=9,
        fontweight="bold",
    )
    halves = [(r * part, part, rank_colour[r], True) for r in range(2)]
    x = matrix(
        1,
        y1 + (inter * u - t_h) / 2,
        inter,
        t_h,
        halves,
        f"Y [T, {inter}] = Y_0 | Y_1\n(never gathered)",
    )
    left.text(x + 1.5, y1 + inter * u / 2, "·", ha="center", va="center", fontsize=16)
    rows = [(r * part, part, rank_colour[r], False) for r in range(2)]
    x = matrix(x + 3, y1, hidden, inter * u, rows, f"B [{inter}, {hidden}]\n= B_0 over B_1")
    left.text(x + 1.5, y1 + inter * u / 2, "=", ha="center", va="center", fontsize=14)
    for r in range(2):
        px = x + 3 + r * (hidden * u + 10)
        matrix(
            px,
            y1 + (inter * u - t_h) / 2,
            hidden,
            t_h,
            [(0, hidden, rank_colour[r], True)],
            f"Y_{r} B_{r} [T, {hidden}]\nrank {r}'s partial sum",
        )
        if r == 0:
            left.text(
                px + hidden * u + 5, y1 + inter * u / 2, "+", ha="center", va="center", fontsize=14
            )
    left.text(
        x + 3,
        y1 + inter * u / 2 + t_h / 2 + 8,
        f"all-reduce: Z = Y_0 B_0 + Y_1 B_1, [T, {hidden}], whole on both ranks",
        color=COLORS[3],
        fontweight="bold",
        fontsize=9,
        va="top",
    )
    for r in range(2):
        box(left, 1 + r * 12, height - 6, 3, 3, rank_colour[r])
        left.text(5 + r * 12, height - 4.5, f"rank {r}", va="center", fontsize=9)
    box(left, 25, height - 6, 3, 3, GREY)
    left.text(29, height - 4.5, "both ranks, whole", va="center", fontsize=9)

    r0 = ranks[0]
    steps = [
        ("embedding: this rank's rows", f"[T, {r0[keys[0]].shape[1]}] partial", True),
        ("qkv_proj (column parallel)", f"[T, {r0[keys[1]].shape[0]}]: its heads", False),
        ("attention on its own heads", f"[T, {r0[keys[2]].shape[1]}]", False),
        ("o_proj (row parallel)", f"[T, {r0[keys[2]].shape[0]}] partial", True),
        ("gate_up_proj (column parallel)", f"[T, {r0[keys[3]].shape[0]}]", False),
        ("silu(gate) * up", f"[T, {r0[keys[4]].shape[1]}]", False),
        ("down_proj (row parallel)", f"[T, {r0[keys[4]].shape[0]}] partial", True),
        ("lm_head: sampled rows only", f"[B, {r0[keys[5]].shape[0]}] → gather", None),
    ]
    diagram(right, 100, len(steps) * 10 + 4)
    right.set_title("One forward on rank 0 (the layer's steps run once per layer)", fontsize=10)
    for i, (op, shape, reduce) in enumerate(steps):
        box(right, 0, i * 10, 52, 8, LIGHT, op, fontsize=9)
        right.text(54, i * 10 + 4, shape, va="center", fontsize=9)
        if reduce:
            right.text(
                80,
                i * 10 + 4,
                "all-reduce",
                va="center",
                color=COLORS[3],
                fontweight="bold",
                fontsize=9,
            )
        elif reduce is None:
            right.text(
                80,
                i * 10 + 4,
                "all-gather",
                va="center",
                color=COLORS[2],
                fontweight="bold",
                fontsize=9,
            )
    return fig
