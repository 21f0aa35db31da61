"""Chapter 20's figure: sort_and_pad.svg, the fused MoE's pairs sorted by expert and padded to
tiles, and the placeholder share.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .common import COLORS, LIGHT, box, diagram, figure


def moe_padding_share(tokens: int, num_experts: int, topk: int, block_m: int) -> float:
    """The share of the padded rows that are placeholders, for random routing of ``tokens``."""
    import torch

    from minisgl.moe.base import select_experts
    from minisgl.moe.fused import moe_align_block_size

    gen = torch.Generator().manual_seed(tokens)
    _, ids = select_experts(torch.randn(tokens, num_experts, generator=gen), topk, True)
    sorted_ids, _ = moe_align_block_size(ids, block_m, num_experts)
    return 1.0 - ids.numel() / sorted_ids.numel()


@figure("ch20", "sort_and_pad")
def sort_and_pad() -> plt.Figure:
    """The main's 5 tokens x top-2 sorted by expert and padded to tiles of 4 (from
    moe_align_block_size), and the placeholder share at Qwen3-30B-A3B's 128 experts, top-8."""
    import torch

    from minisgl.moe.base import select_experts
    from minisgl.moe.fused import moe_align_block_size

    torch.manual_seed(0)
    torch.randn(5, 64)  # the main's x: the gating below is then the main's
    _, ids = select_experts(torch.randn(5, 8), 2, True)
    sorted_ids, expert_ids = moe_align_block_size(ids, 4, 8)
    flat, num_pairs = ids.flatten().tolist(), ids.numel()
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(12, 7.6), layout="constrained", height_ratios=[1, 1.5]
    )
    fig.suptitle(
        "Fused MoE: the (token, expert) pairs sorted by expert, each run padded to whole tiles"
    )
    diagram(top, 24.5, 4.2)
    for i, e in enumerate(flat):
        box(top, 0.5 + i, 0.3, 1, 1, COLORS[e], f"{i}", color="white", fontsize=10)
        top.text(1 + i, 1.6, f"t{i // 2}", ha="center", fontsize=8)
    top.text(
        11,
        0.8,
        "pairs in token order (pair i is token i // 2); the colour is its expert",
        va="center",
        fontsize=9,
    )
    for i, pair in enumerate(sorted_ids.tolist()):
        pad = pair == num_pairs
        box(
            top,
            0.5 + i,
            2.3,
            1,
            1,
            LIGHT if pad else COLORS[flat[pair]],
            str(pair),
            color="#777777" if pad else "white",
            fontsize=10,
        )
    for tile, e in enumerate(expert_ids.tolist()):
        top.plot([0.5 + 4 * tile] * 2, [2.1, 3.5], color="#444444", linewidth=1.2)
        top.text(2.5 + 4 * tile, 3.9, f"tile {tile}: expert {e}", ha="center", fontsize=9)
    top.set_title(
        f"The main's 5 tokens, top-2 of 8 experts, BLOCK_M = 4: {num_pairs} pairs "
        f"become {sorted_ids.numel()} rows ({num_pairs}, pale, marks a placeholder)",
        fontsize=10,
    )
    tokens = [2**p for p in range(14)]
    for k, block_m in enumerate([16, 64]):
        share = [100 * moe_padding_share(t, 128, 8, block_m) for t in tokens]
        bottom.plot(tokens, share, "o-", color=COLORS[k], label=f"BLOCK_M = {block_m}")
    bottom.set_xscale("log", base=2)
    bottom.set_xticks(tokens, [str(t) for t in tokens])
    bottom.set_xlabel("tokens in the batch (random routing)")
    bottom.set_ylabel("placeholder rows (%)")
    bottom.set_ylim(0, 100)
    bottom.set_title(
        "Qwen3-30B-A3B's MoE layer (128 experts, top-8): the share of the rows the "
        "two GEMMs run that are padding",
        fontsize=10,
    )
    bottom.legend(fontsize=9)
    bottom.grid(alpha=0.3)
    return fig
