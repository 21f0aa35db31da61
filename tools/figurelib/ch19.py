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
    """Left: what each of two ranks holds of the tiny Llama 3's weights, loaded with the
    chapter's shard(). Right: one forward's path on a rank, with its shapes and collectives."""
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_model("llama3", tmp)
        whole = rank_state(path, 0, 1)
        ranks = [rank_state(path, r, 2) for r in range(2)]
    names = [
        "embed_tokens",
        "qkv_proj",
        "o_proj",
        "gate_up_proj",
        "down_proj",
        "input_layernorm",
        "lm_head",
    ]
    keys = [next(k for k in whole if name in k) for name in names]
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(13, 5.4), width_ratios=[1.1, 1], layout="constrained"
    )
    total = sum(t.numel() for t in whole.values())
    held = sum(t.numel() for t in ranks[0].values())
    fig.suptitle(
        f"Two ranks: each holds {100 * held / total:.1f}% of the tiny Llama 3's "
        f"{total:,} weights (the norms whole on both)"
    )
    for y, (name, key) in enumerate(zip(names, keys)):
        full = whole[key].numel()
        parts = [r[key].numel() for r in ranks]
        split = sum(parts) == full
        left.barh(y, parts[0], color=COLORS[0], label="rank 0" if y == 0 else None)
        left.barh(
            y,
            parts[1],
            left=parts[0] if split else 0,
            color=COLORS[1] if split else GREY,
            alpha=1 if split else 0.6,
            label="rank 1" if y == 0 else ("both: a whole copy" if not split else None),
        )
        shape = f"{list(whole[key].shape)} → {list(ranks[0][key].shape)} each"
        left.text(full * 1.02, y, shape, va="center", fontsize=9)
    left.set_yticks(range(len(names)), names)
    left.invert_yaxis()
    left.set_xlim(0, max(t.numel() for t in whole.values()) * 2.5)
    left.set_xlabel("elements")
    left.set_title("Layer 0's weights and the vocabulary, cut by shard()", fontsize=10)
    left.legend(fontsize=9, loc="center right")

    r0 = ranks[0]
    steps = [
        ("embedding: this rank's rows", f"[T, {r0[keys[0]].shape[1]}] partial", True),
        ("qkv_proj (column parallel)", f"[T, {r0[keys[1]].shape[0]}]: its heads", False),
        ("attention on its own heads", f"[T, {r0[keys[2]].shape[1]}]", False),
        ("o_proj (row parallel)", f"[T, {r0[keys[2]].shape[0]}] partial", True),
        ("gate_up_proj (column parallel)", f"[T, {r0[keys[3]].shape[0]}]", False),
        ("silu(gate) * up", f"[T, {r0[keys[4]].shape[1]}]", False),
        ("down_proj (row parallel)", f"[T, {r0[keys[4]].shape[0]}] partial", True),
        ("lm_head: its vocabulary rows", f"[T, {r0[keys[6]].shape[0]}] → gather", None),
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
