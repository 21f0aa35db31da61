"""Chapter 16's figures: split_k.svg, how split-K decode divides a batch's keys among the
kernel's programs; extend_tiles.svg, the tiles the extend kernel walks over one request's scores.
"""

from __future__ import annotations

from typing import NamedTuple

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.colors import to_hex, to_rgb
from matplotlib.patches import Rectangle

from .common import COLORS, GREY, LIGHT, figure


def split_ranges(seq_len: int, num_splits: int, block_n: int) -> list[tuple[int, int]]:
    """(start, end) of each split's keys, as decode's two stages compute them (``_split_len``):
    an even share rounded up to whole blocks; a split starting at or past seq_len is empty."""

    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    split_len = cdiv(cdiv(seq_len, num_splits), block_n) * block_n
    return [(s * split_len, min((s + 1) * split_len, seq_len)) for s in range(num_splits)]


@figure("ch16", "split_k")
def split_k() -> plt.Figure:
    """Split-K decode at Qwen3-0.6B's shape (8 KV heads, bf16 tiles): the kernel's own
    default_num_kv_splits by batch size, and the keys each split of a 4-request batch reads
    (the workload's first four sequences at their 300th decode step)."""
    from ch15_measure import SHAPES, nano_vllm_workload

    from minisgl.kernel.attention import DECODE_TILES, default_num_kv_splits

    kv_heads = SHAPES["qwen3-0.6b"]["num_key_value_heads"]
    block_n = DECODE_TILES["16bit"]["BLOCK_N"]
    fig, axes = plt.subplot_mosaic(
        [["splits", "batch"], ["programs", "batch"]],
        figsize=(12, 6),
        width_ratios=[1, 1.25],
        layout="constrained",
    )
    fig.suptitle("Split-K decode: how a batch's keys are divided among the kernel's programs")
    batches = list(range(1, 257))
    splits = [default_num_kv_splits(b, kv_heads) for b in batches]
    programs = [b * kv_heads * s for b, s in zip(batches, splits)]
    powers = [b for b in batches if b & (b - 1) == 0]
    top, low = axes["splits"], axes["programs"]
    top.step(batches, splits, where="post", color=COLORS[0])
    top.plot(powers, [splits[b - 1] for b in powers], "o", color=COLORS[0])
    for b in powers:
        top.text(b * 1.08, splits[b - 1] + 1.2, str(splits[b - 1]), fontsize=9)
    top.set_ylabel("splits per request")
    top.set_ylim(0, 40)
    top.set_title(
        f"default_num_kv_splits at {kv_heads} KV heads, for every batch of 1 to 256", fontsize=10
    )
    low.step(batches, programs, where="post", color=COLORS[1], label="B x KV heads x splits")
    low.plot(powers, [programs[b - 1] for b in powers], "o", color=COLORS[1])
    low.axhline(1024, color=COLORS[1], linestyle=":", label="1,024: what the rule aims at")
    low.axhline(132, color=GREY, linestyle="--", label="an H200's 132 SMs")
    low.set_yscale("log", base=2)
    low.set_ylim(2**6, 2**13)
    ticks = [2**k for k in range(6, 14)]
    low.set_yticks(ticks, [f"{t:,}" for t in ticks])
    low.set_ylabel("stage-1 programs")
    low.legend(loc="lower right", fontsize=9)
    for ax in (top, low):
        ax.set_xscale("log", base=2)
        ax.set_xticks(powers, [str(b) for b in powers])
        ax.set_xlim(0.8, 300)
        ax.grid(alpha=0.3)
    example = 48  # exercise 2's batch: splits round up to a power of two, so programs overshoot
    low.annotate(
        f"{example} requests: {splits[example - 1]} splits, {programs[example - 1]:,} programs",
        (example, programs[example - 1]),
        (1.1, 2**12.2),
        fontsize=9,
        arrowprops=dict(arrowstyle="-|>", color="#444444"),
    )
    low.set_xlabel("requests in the decode batch (B)")

    right = axes["batch"]
    prompts, _ = nano_vllm_workload(4)
    lens = [len(p) + 300 for p in prompts]  # context at decode step 300, the new token included
    num_splits = default_num_kv_splits(len(lens), kv_heads)
    for row, seq_len in enumerate(lens):
        ranges = split_ranges(seq_len, num_splits, block_n)
        full = [(a, b - a) for a, b in ranges if a < b]
        for i, (start, width) in enumerate(full):
            right.broken_barh(
                [(start, width)], (row - 0.35, 0.7), facecolors=COLORS[i % 2], edgecolor="white"
            )
        right.text(
            seq_len + 30,
            row,
            f"{seq_len:,} keys: {len(full)} splits of "
            f"{ranges[0][1]}, {num_splits - len(full)} empty",
            va="center",
            fontsize=9,
        )
    right.set_yticks(range(len(lens)), [f"request {i}" for i in range(len(lens))])
    right.set_ylim(len(lens) - 0.4, -0.6)
    right.set_xlim(0, max(lens) * 1.6)
    right.set_xlabel("key position (each split a bar; its keys read through the page table)")
    right.set_title(
        f"a batch of {len(lens)}: {num_splits} splits each, an even share rounded "
        f"up to whole {block_n}-key blocks",
        fontsize=10,
    )
    right.grid(alpha=0.3, axis="x")
    return fig


class Tile(NamedTuple):
    """One tile of a request's scores: queries [q0, q1) of its new tokens, keys [k0, k1) of its
    cached_len + extend_len positions; step is its place in the program's loop (0 if skipped)."""

    kind: str  # "prefix", "full", "diagonal" (causal mask inside) or "skipped"
    q0: int
    q1: int
    k0: int
    k1: int
    step: int


def extend_tiles(cached_len: int, extend_len: int, block_m: int, block_n: int) -> list[Tile]:
    """The tiles _extend_kernel walks for one request and one head, by its loop bounds
    (python/minisgl/kernel/attention.py, which has no helper for them): a program per query block
    of block_m (``offs_m``); part 1, ``for n in range(0, cached_len, BLOCK_N)`` over the prefix
    with only the key mask; part 2, ``for n in range(0, causal_end, BLOCK_N)`` with ``causal_end =
    min((block + 1) * BLOCK_M, extend_len)`` over the new tokens, every tile masked with
    ``visible``: key j seen by query i when j <= i. A tile whose keys all come at or before the
    block's first query ("full") passes that mask whole. The new tokens' keys are tiled from the
    first new token, not from position 0; those at causal_end and past are never read."""

    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    tiles = []
    for block in range(cdiv(extend_len, block_m)):
        q0, q1 = block * block_m, min((block + 1) * block_m, extend_len)
        step = 0
        for n in range(0, cached_len, block_n):
            step += 1
            tiles.append(Tile("prefix", q0, q1, n, min(n + block_n, cached_len), step))
        causal_end = min((block + 1) * block_m, extend_len)
        for n in range(0, causal_end, block_n):
            step += 1
            end = min(n + block_n, causal_end)
            kind = "diagonal" if end - 1 > q0 else "full"  # some key after the block's 1st query
            tiles.append(Tile(kind, q0, q1, cached_len + n, cached_len + end, step))
        for n in range(causal_end, extend_len, block_n):  # wholly above the diagonal
            end = min((n // block_n + 1) * block_n, extend_len)  # on part 2's grid of keys
            tiles.append(Tile("skipped", q0, q1, cached_len + n, cached_len + end, 0))
    return tiles


TILE_STYLE = {  # kind -> (fill, legend)
    "prefix": (COLORS[0], "prefix keys: no causal mask, only k < cached_len (part 1)"),
    "full": (
        COLORS[2],
        "new keys at or before the block's first query: mask j <= i, all true (part 2)",
    ),
    "diagonal": (COLORS[1], "new keys crossing the diagonal: mask j <= i hides some (part 2)"),
    "skipped": (LIGHT, "new keys after the block's last query: never read"),
}


def _tile_patch(kind: str, xy: tuple[float, float], width: float, height: float) -> Rectangle:
    if kind == "skipped":  # above the masked scores' veil, its hatch in grey
        return Rectangle(
            xy, width, height, facecolor=LIGHT, edgecolor=GREY, linewidth=1, hatch="//", zorder=3
        )
    return Rectangle(
        xy, width, height, facecolor=TILE_STYLE[kind][0], edgecolor="white", linewidth=2
    )


def _tile_panel(ax: Axes, cached_len: int, extend_len: int, tiles: dict, title: str) -> None:
    total = cached_len + extend_len
    for t in extend_tiles(cached_len, extend_len, tiles["BLOCK_M"], tiles["BLOCK_N"]):
        ax.add_patch(_tile_patch(t.kind, (t.k0, t.q0), t.k1 - t.k0, t.q1 - t.q0))
        if t.step:  # a diagonal tile's number below the diagonal, on its visible scores
            at = (0.3, 0.7) if t.kind == "diagonal" else (0.5, 0.5)
            ax.text(
                t.k0 + at[0] * (t.k1 - t.k0),
                t.q0 + at[1] * (t.q1 - t.q0),
                str(t.step),
                ha="center",
                va="center",
                color="white",
                fontsize=10,
                fontweight="bold",
            )
    ax.fill(
        [cached_len, total, total],
        [0, 0, extend_len],
        color="white",
        alpha=0.5,
        linewidth=0,
        zorder=2,
    )
    ax.plot(
        [cached_len, total],
        [0, extend_len],
        color="black",
        linewidth=1.2,
        label="the causal diagonal: query i sees new key j <= i",
    )
    ax.axvline(cached_len, color="black", linestyle="--", linewidth=1)
    ax.set_xlim(0, total)
    ax.set_ylim(extend_len, 0)
    blocks = range(0, extend_len, tiles["BLOCK_M"])
    ends = [min(q + tiles["BLOCK_M"], extend_len) for q in blocks]
    # the kernel's block = num_programs(2) - 1 - program_id(2): the last block runs first
    ax.set_yticks(
        [(q + e) / 2 for q, e in zip(blocks, ends)],
        [
            f"queries {q}-{e - 1}\nprogram_id(2) = {len(ends) - 1 - b}"
            for b, (q, e) in enumerate(zip(blocks, ends))
        ],
        fontsize=9,
    )
    keys = sorted(
        {0, cached_len, total}
        | set(range(0, cached_len, tiles["BLOCK_N"]))
        | set(range(cached_len, total, tiles["BLOCK_N"]))
    )
    ax.set_xticks(keys, [str(k) for k in keys], fontsize=9)
    ax.set_title(title, fontsize=10)
    ax.tick_params(length=0)
    ax.spines[:].set_visible(False)


@figure("ch16", "extend_tiles")
def extend_tiles_figure() -> plt.Figure:
    """One request of the extend test (150 tokens cached, 40 new) as the kernel tiles its scores,
    with the tile sizes extend_attention picks for float32 (the tests) and for bf16 (the model)."""
    import torch

    from minisgl.kernel.attention import EXTEND_TILES, _tiles

    # the request of tests/test_ch16_triton.py's test_extend_many_pages_and_odd_head_dim
    cached_len, extend_len = 150, 40
    fig, axes = plt.subplots(2, 1, figsize=(12, 6.6), layout="constrained")
    fig.suptitle(
        f"Extend attention's tiles: {extend_len} new queries over {cached_len} cached "
        f"and {extend_len} new keys"
    )
    for ax, dtype in zip(axes, [torch.float32, torch.bfloat16]):
        tiles = _tiles(EXTEND_TILES, dtype)
        name = str(dtype).removeprefix("torch.")
        _tile_panel(
            ax,
            cached_len,
            extend_len,
            tiles,
            f"{name}: BLOCK_M = {tiles['BLOCK_M']} queries x BLOCK_N = "
            f"{tiles['BLOCK_N']} keys; a program per query block, its tiles in the "
            f"numbered order",
        )
    axes[-1].set_xlabel(
        f"key position: the cached prefix 0-{cached_len - 1} (left of the "
        f"dashed line), the new tokens {cached_len}-{cached_len + extend_len - 1}"
    )
    handles = [_tile_patch(kind, (0, 0), 1, 1) for kind in TILE_STYLE]
    labels = [label for _, label in TILE_STYLE.values()]
    veiled = to_hex([(c + 1) / 2 for c in to_rgb(COLORS[1])])  # the diagonal's fill under the veil
    handles.append(Rectangle((0, 0), 1, 1, facecolor=veiled, edgecolor="white"))
    labels.append("masked scores in a diagonal tile (j > i): computed, set to -inf")
    line = axes[0].get_legend_handles_labels()
    fig.legend(handles + line[0], labels + line[1], loc="outside lower center", ncols=2, fontsize=9)
    return fig
