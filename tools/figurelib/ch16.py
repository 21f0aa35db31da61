"""Chapter 16's figure: split_k.svg, how split-K decode divides a batch's keys among the
kernel's programs.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .common import COLORS, GREY, figure


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
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5), width_ratios=[1, 1.25],
                                      layout="constrained")
    fig.suptitle("Split-K decode: how a batch's keys are divided among the kernel's programs")
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    splits = [default_num_kv_splits(b, kv_heads) for b in batches]
    programs = [b * kv_heads * s for b, s in zip(batches, splits)]
    x = range(len(batches))
    left.bar(x, splits, color=COLORS[0], label="splits per request (left axis)")
    for i, s in zip(x, splits):
        left.text(i, s + 0.4, str(s), ha="center", fontsize=9)
    left.set_xticks(list(x), [str(b) for b in batches])
    left.set_xlabel("requests in the decode batch")
    left.set_ylabel("num_kv_splits")
    left.set_ylim(0, 44)  # the legend above the bars
    left.set_title(f"default_num_kv_splits, {kv_heads} KV heads: aim at ~1,024 programs",
                   fontsize=10)
    count = left.twinx()
    count.plot(x, programs, "o-", color=COLORS[1], label="stage-1 programs: B x KV heads x splits")
    count.axhline(132, color=GREY, linestyle="--", label="an H200's 132 SMs")
    count.set_yscale("log", base=2)
    count.set_ylim(2**6, 2**15)  # the legend above the curve
    count.set_ylabel("stage-1 programs (right axis)")
    handles = left.get_legend_handles_labels()[0] + count.get_legend_handles_labels()[0]
    left.legend(handles=handles, loc="upper right", fontsize=9)

    prompts, _ = nano_vllm_workload(4)
    lens = [len(p) + 300 for p in prompts]  # context at decode step 300, the new token included
    num_splits = default_num_kv_splits(len(lens), kv_heads)
    for row, seq_len in enumerate(lens):
        ranges = split_ranges(seq_len, num_splits, block_n)
        full = [(a, b - a) for a, b in ranges if a < b]
        for i, (start, width) in enumerate(full):
            right.broken_barh([(start, width)], (row - 0.35, 0.7),
                              facecolors=COLORS[i % 2], edgecolor="white")
        right.text(seq_len + 30, row, f"{seq_len:,} keys: {len(full)} splits of "
                   f"{ranges[0][1]}, {num_splits - len(full)} empty", va="center", fontsize=9)
    right.set_yticks(range(len(lens)), [f"request {i}" for i in range(len(lens))])
    right.set_ylim(len(lens) - 0.4, -0.6)
    right.set_xlim(0, max(lens) * 1.6)
    right.set_xlabel("key position (each split a bar; its keys read through the page table)")
    right.set_title(f"a batch of {len(lens)}: {num_splits} splits each, an even share rounded "
                    f"up to whole {block_n}-key blocks", fontsize=10)
    right.grid(alpha=0.3, axis="x")
    return fig
