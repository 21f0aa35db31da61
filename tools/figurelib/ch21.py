"""Chapter 21's figure: moe_layer_time.svg, bench_moe.py's recorded H200 run against the
roofline.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .common import COLORS, GREY, ROOT, arrow, diagram, figure

MOE_RESULTS = ROOT / "benchmark/results/moe_h200_2026-12-01.json"  # measured, not computed here


@figure("ch21", "moe_layer_time", recorded=True)
def moe_layer_time() -> plt.Figure:
    """bench_moe.py's H200 run: the whole MoE layer's time per token count for chapter 20's
    backend, chapter 21's and the roofline; and chapter 21's over the roofline. The run's tuned
    baseline is left out: the chapter sets the layer beside upstream's kernel instead."""
    import json

    record = json.loads(MOE_RESULTS.read_text(encoding="utf-8"))
    tokens, ms = record["tokens"], record["ms"]
    styles = {
        "ch20 fused": (GREY, "s-"),
        "ch21 fast": (COLORS[0], "o-"),
        "roofline": (COLORS[3], "--"),
    }
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5), layout="constrained")
    shape = record["shape"]
    fig.suptitle(
        f"Qwen3-30B-A3B's MoE layer on an {record['device']} "
        f"(E={shape['experts']}, top-{shape['topk']}, H={shape['hidden']}, "
        f"I={shape['inter']}, bf16), {record['date'][:10]}"
    )
    for name, (color, style) in styles.items():
        left.plot(tokens, ms[name], style, color=color, label=name, markersize=4)
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("tokens in the batch")
    left.set_ylabel("ms per whole layer (8 layers a CUDA graph; ch20 eager)")
    left.set_title("time per layer", fontsize=10)
    left.legend(fontsize=9)
    left.grid(alpha=0.3, which="both")
    color, style = styles["ch21 fast"]
    over = [t / r for t, r in zip(ms["ch21 fast"], ms["roofline"])]
    right.plot(tokens, over, style, color=color, label="ch21 fast", markersize=4)
    right.axhline(1.5, color=COLORS[3], linestyle=":", label="1.5x the roofline")
    right.set_xscale("log", base=2)
    right.set_ylim(1, 2)
    right.set_xlabel("tokens in the batch")
    right.set_ylabel("time / roofline")
    ceil = record["ceilings"]
    right.set_title(
        f"over the roofline: max(weights touched / {ceil['copy_tbps']:.2f} TB/s, "
        f"FLOPs / {ceil['peak_tflops']:.0f} TFLOP/s)",
        fontsize=10,
    )
    right.legend(fontsize=9)
    right.grid(alpha=0.3, which="both")
    return fig


# what each kernel writes, by its argument names (read off the kernels in kernel/moe_routing.py,
# fused_moe.py and moe_decode.py); the plan also writes sorted_ids' padding slots
MOE_WRITES = {
    "_route_and_count_kernel": ("weights_ptr", "ids_ptr", "block_counts_ptr"),
    "_sum_chunks_kernel": ("chunk_counts_ptr",),
    "_plan_tiles_kernel": (
        "block_offsets_ptr",
        "expert_ids_ptr",
        "num_padded_ptr",
        "sorted_ids_ptr",
    ),
    "_scatter_pairs_kernel": ("sorted_ids_ptr",),
    "_gate_up_silu_kernel": ("h_ptr",),
    "_down_kernel": ("y_ptr",),
    "_sum_choices_kernel": ("out_ptr",),
    "_decode_gate_up_kernel": ("h_ptr",),
    "_decode_down_kernel": ("out_ptr",),
}
MOE_STEPS = {  # what each launch does, in the chapter's words
    "_route_and_count_kernel": "route and count",
    "_sum_chunks_kernel": "chunk sums",
    "_plan_tiles_kernel": "plan",
    "_scatter_pairs_kernel": "scatter",
    "_gate_up_silu_kernel": "first GEMM:\ngate, up, SiLU",
    "_down_kernel": "second GEMM:\n× routing weight",
    "_sum_choices_kernel": "k-sum",
    "_decode_gate_up_kernel": "gate, up, SiLU:\nthe chosen experts",
    "_decode_down_kernel": "second GEMM,\n× weight, k-sum inside",
}


def interpret_triton() -> None:
    """Triton's interpreter for every kernel of this process: it is chosen when a kernel is
    defined, so before the first of chapter 21's kernel modules is imported (the tile plan runs
    them on the CPU)."""
    import os

    os.environ.setdefault("TRITON_INTERPRET", "1")


DTYPES = {"torch.bfloat16": "bf16", "torch.float32": "fp32", "torch.int32": "int32"}


def moe_launches(num_tokens: int, shape: dict) -> tuple[list[tuple[str, tuple, dict]], dict]:
    """The launches SyncFreeMoeBackend.forward_with makes for num_tokens tokens at shape (a
    config.json's keys), with the H200 file's config for that count: (kernel, grid,
    {argument: (shape, dtype)}) each. Tensors are on torch's meta device and every kernel is
    replaced by a recorder while the forward runs, so nothing is computed."""
    interpret_triton()
    import torch

    from minisgl.kernel import fused_moe, moe_decode, moe_routing
    from minisgl.moe.configs import config_file_name, load_tuned, nearest
    from minisgl.moe.sync_free import SyncFreeMoeBackend

    launches: list[tuple[str, tuple, dict]] = []

    class Recorder:
        def __init__(self, kernel) -> None:
            self.kernel = kernel

        def __getitem__(self, grid: tuple):
            def launch(*args, **_kwargs) -> None:
                tensors = {
                    name: (tuple(a.shape), DTYPES.get(str(getattr(a, "dtype", "")), ""))
                    for name, a in zip(self.kernel.arg_names, args)
                    if a is not None and hasattr(a, "shape")
                }
                launches.append((self.kernel.fn.__name__, grid, tensors))

            return launch

    hidden, inter = shape["hidden_size"], shape["moe_intermediate_size"]
    experts, topk = shape["num_experts"], shape["num_experts_per_tok"]
    tuned = load_tuned(config_file_name(experts, inter, torch.bfloat16, "NVIDIA H200"))
    config = nearest(tuned, num_tokens)
    saved = [
        (m, n, getattr(m, n))
        for m in (moe_routing, fused_moe, moe_decode)
        for n in dir(m)
        if n.endswith("_kernel") and hasattr(getattr(m, n), "arg_names")
    ]
    meta = dict(dtype=torch.bfloat16, device="meta")
    try:
        for module, name, kernel in saved:
            setattr(module, name, Recorder(kernel))
        SyncFreeMoeBackend().forward_with(
            config,
            torch.empty(num_tokens, hidden, **meta),
            torch.empty(experts, 2 * inter, hidden, **meta),
            torch.empty(experts, hidden, inter, **meta),
            torch.empty(num_tokens, experts, dtype=torch.float32, device="meta"),
            topk,
            shape["norm_topk_prob"],
        )
    finally:
        for module, name, kernel in saved:
            setattr(module, name, kernel)
    return launches, config


@figure("ch21", "moe_launches")
def moe_launches_figure() -> plt.Figure:
    """The fast backend's launches at Qwen3-30B-A3B's shape, one row per path: each kernel, its
    programs, and the tensors it writes, recorded from SyncFreeMoeBackend.forward_with itself."""
    from ch15_measure import SHAPES
    from matplotlib.patches import FancyBboxPatch

    from minisgl.moe.configs import DECODE_MAX_TOKENS

    shape = SHAPES["qwen3-30b-a3b"]
    paths = [(4096, "the aligned path"), (1, "the decode path")]
    recorded = [(t, label, *moe_launches(t, shape)) for t, label in paths]
    pipeline = [name for name, _, _ in recorded[0][2]]
    width, box_w, box_h = 1.95, 1.72, 1.05
    fig, ax = plt.subplots(figsize=(14.2, 6.0), layout="constrained")
    diagram(ax, width * len(pipeline), 6.45)
    fig.suptitle(
        f"The fast MoE layer's launches at Qwen3-30B-A3B's shape "
        f"(H={shape['hidden_size']:,}, "
        f"I={shape['moe_intermediate_size']}, E={shape['num_experts']}, "
        f"top-{shape['num_experts_per_tok']}, bf16)"
    )

    def dims(s: tuple) -> str:
        return "[" + ", ".join(f"{d:,}" for d in s) + "]"

    for row, (tokens, label, launches, config) in enumerate(recorded):
        top = 0.75 + row * 3.2
        side = "≤" if tokens <= DECODE_MAX_TOKENS else ">"
        extra = (
            f", BLOCK_M {config['BLOCK_M']}"
            if config["path"] == "aligned"
            else ", each launched early (PDL)"
        )
        ax.text(
            0.02,
            top - 0.3,
            f"T = {tokens:,} ({side} {DECODE_MAX_TOKENS} tokens): {label}, "
            f"{len(launches)} launches{extra}",
            fontsize=11,
            fontweight="bold",
        )
        ends = []
        for name, grid, tensors in launches:
            # the decode path's kernels sit under the pipeline's steps they stand for
            col = {"_decode_gate_up_kernel": 4, "_decode_down_kernel": 5}.get(
                name, pipeline.index(name) if name in pipeline else 0
            )
            span = 2 if name == "_decode_down_kernel" else 1
            x, w = col * width + 0.08, box_w + (span - 1) * width
            color = (
                COLORS[0]
                if "route" in name or "plan" in name or "scatter" in name or "chunks" in name
                else COLORS[2]
            )
            ax.add_patch(
                FancyBboxPatch(
                    (x, top),
                    w,
                    box_h,
                    boxstyle="round,pad=0.02",
                    facecolor=color,
                    edgecolor="white",
                    alpha=0.9,
                )
            )
            programs = 1
            for g in grid:
                programs *= g
            ax.text(
                x + w / 2,
                top + 0.3,
                MOE_STEPS[name],
                ha="center",
                va="center",
                fontsize=9.5,
                color="white",
                fontweight="bold",
            )
            ax.text(
                x + w / 2,
                top + 0.66,
                name,
                ha="center",
                va="center",
                fontsize=9,
                color="white",
                family="monospace",
            )
            ax.text(
                x + w / 2,
                top + 0.9,
                f"{programs:,} program{'s' if programs > 1 else ''}",
                ha="center",
                va="center",
                fontsize=9,
                color="white",
            )
            writes = [
                f"{n.removesuffix('_ptr')} {dims(tensors[n][0])} {tensors[n][1]}"
                + (" (padding)" if name == "_plan_tiles_kernel" and n == "sorted_ids_ptr" else "")
                for n in MOE_WRITES[name]
                if n in tensors
            ]
            if name == "_route_and_count_kernel" and "block_counts_ptr" not in tensors:
                writes.append("(no counts: count=False)")
            ax.text(
                x + 0.02,
                top + box_h + 0.12,
                "writes\n" + "\n".join(writes),
                ha="left",
                va="top",
                fontsize=9,
                color="#333333",
                linespacing=1.25,
            )
            if ends:
                arrow(ax, (ends[-1], top + box_h / 2), (x, top + box_h / 2))
                if x - ends[-1] > width:  # the decode path skips the alignment
                    ax.text(
                        (ends[-1] + x) / 2,
                        top + box_h / 2 - 0.12,
                        "no sorting: each program's pair names its expert",
                        ha="center",
                        va="bottom",
                        fontsize=9.5,
                        color="#333333",
                    )
            ends.append(x + w)
    ax.text(
        0.02,
        6.4,
        "No launch reads anything back to the host: every buffer is sized for "
        "the worst routing before it is known, and the used size (num_padded) stays on the "
        "device,\nwhere programs past it return at once. So both paths are captured in a CUDA "
        "graph. Blue: routing and alignment; green: the GEMMs and the sum.",
        fontsize=9.5,
        va="bottom",
        color="#333333",
    )
    return fig


# the main's small case: chapter 20's main's first draws, 8 experts, top-2, tiles of 4 slots
PLAN_CASE = dict(tokens=5, hidden=64, experts=8, topk=2, block_m=4)
# smaller launch sizes than the kernels' (16 tokens a block, 32 blocks a chunk, 64 tiles a
# program), so that the five tokens make several blocks, chunks and programs of the plan
PLAN_SIZES = {"ROUTE_BLOCK_T": 2, "PLAN_CHUNK_B": 2, "PLAN_TILE_CHUNK": 4}
EXPERT_COLORS = [COLORS[i] for i in (0, 1, 2, 3, 4, 5, 6, 9)]  # no grey: grey is padding


def plan_of_main_case() -> dict:
    """route and align on the main's five tokens, run in Triton's interpreter with PLAN_SIZES;
    every tensor the four kernels write, by name, kept as the kernels wrote them."""
    interpret_triton()
    import torch

    from minisgl.kernel import moe_routing
    from minisgl.moe.fused import moe_align_block_size

    written: dict = {}

    class Keep:  # runs the kernel, then keeps its arguments by name
        def __init__(self, kernel) -> None:
            self.kernel = kernel

        def __getitem__(self, grid: tuple):
            def launch(*args, **kwargs) -> None:
                self.kernel[grid](*args, **kwargs)
                written[self.kernel.fn.__name__] = dict(zip(self.kernel.arg_names, args))
                written[self.kernel.fn.__name__]["programs"] = grid[0]

            return launch

    names = [n for n in dir(moe_routing) if n.endswith("_kernel")]
    saved = {n: getattr(moe_routing, n) for n in [*names, *PLAN_SIZES]}
    case = PLAN_CASE
    try:
        for name in names:
            setattr(moe_routing, name, Keep(saved[name]))
        for name, size in PLAN_SIZES.items():
            setattr(moe_routing, name, size)
        torch.manual_seed(0)
        _, gating = (
            torch.randn(case["tokens"], case["hidden"]),
            torch.randn(case["tokens"], case["experts"]),
        )
        _, ids, block_counts = moe_routing.route(gating, case["topk"], renormalize=True)
        sorted_ids, expert_ids, num_padded = moe_routing.align(
            ids, block_counts, case["experts"], case["block_m"]
        )
    finally:
        for name, value in saved.items():
            setattr(moe_routing, name, value)
    used = int(num_padded)
    ch20 = moe_align_block_size(ids, case["block_m"], case["experts"])[0]
    assert torch.equal(sorted_ids[:used], ch20), "the plan's order is not chapter 20's"
    return {
        "ids": ids.tolist(),
        "block_counts": block_counts[:, : case["experts"]].tolist(),
        "chunk_counts": written["_sum_chunks_kernel"]["chunk_counts_ptr"][:, : case["experts"]],
        "block_offsets": written["_plan_tiles_kernel"]["block_offsets_ptr"][:, : case["experts"]],
        "sorted_ids": sorted_ids.tolist(),
        "expert_ids": expert_ids.tolist(),
        "used": used,
        "programs": {name: w["programs"] for name, w in written.items()},
    }


@figure("ch21", "tile_plan")
def tile_plan() -> plt.Figure:
    """The main's five tokens through the four routing and alignment launches: each block's
    counts, the chunks' sums, each expert's run of tiles, each block's offsets, and the slots of
    sorted_ids the scatter and the plan fill; all read off the kernels' own outputs."""
    from .common import LIGHT, box

    plan = plan_of_main_case()
    case = PLAN_CASE
    experts, block_m, topk = case["experts"], case["block_m"], case["topk"]
    block_t, chunk_b = PLAN_SIZES["ROUTE_BLOCK_T"], PLAN_SIZES["PLAN_CHUNK_B"]
    pairs = case["tokens"] * topk
    counts = [int(c) for c in plan["chunk_counts"].sum(0).tolist()]
    tiles = [(c + block_m - 1) // block_m for c in counts]
    ch = 0.62  # a cell's height
    left, cw = 7.2, 1.45  # the tables' first column and a column's width
    fig, ax = plt.subplots(figsize=(14.5, 10.4), layout="constrained")
    diagram(ax, 33, 18.1)
    fig.suptitle(
        f"The tile plan of the main's {case['tokens']} tokens: {experts} experts, top-{topk}, "
        f"tiles of {block_m} slots ({pairs} pairs; pair p is token p // {topk}'s choice p % {topk})"
    )

    def header(y: float, text: str, note: str) -> None:
        ax.text(0.1, y, text, fontsize=11.5, fontweight="bold", va="bottom")
        ax.text(0.1, y + 0.05, note, fontsize=9.5, va="top", color="#333333")

    def table(y: float, rows: list[list[int]], labels: list[str], shown=None) -> float:
        """A row per label, a column per expert; a cell is grey where shown says it is not."""
        for e in range(experts):
            ax.text(left + e * cw + cw / 2, y - 0.1, f"e{e}", ha="center", va="bottom", fontsize=9)
        for r, (row, label) in enumerate(zip(rows, labels)):
            top = y + r * ch
            ax.text(left - 0.15, top + ch / 2, label, ha="right", va="center", fontsize=9.5)
            for e, value in enumerate(row):
                on = shown is None or shown[r][e]
                fill = EXPERT_COLORS[e] if on and value else LIGHT
                box(
                    ax,
                    left + e * cw,
                    top,
                    cw,
                    ch,
                    fill,
                    f"{int(value)}",
                    fontsize=10,
                    color="white" if on and value else "#777777",
                )
        return y + len(rows) * ch

    # 1. route and count
    blocks = plan["block_counts"]
    y = 1.2
    header(
        y,
        f"1. route: {plan['programs']['_route_and_count_kernel']} programs of {block_t} tokens",
        "each block's pairs per expert, block_counts[block, e]",
    )
    labels = []
    for b in range(len(blocks)):
        toks = range(b * block_t, min((b + 1) * block_t, case["tokens"]))
        chosen = "  ".join(f"t{t}→{plan['ids'][t]}" for t in toks)
        labels.append(f"block {b}: {chosen}")
    y = table(y + 1.0, blocks, labels)
    # 2. the chunks' sums
    chunks = plan["chunk_counts"].tolist()
    y += 0.9
    header(
        y,
        f"2. chunk sums: {plan['programs']['_sum_chunks_kernel']} programs",
        f"chunk_counts[c, e]: the sum of blocks {chunk_b}c .. {chunk_b}c + {chunk_b - 1}",
    )
    y = table(y + 1.0, chunks, [f"chunk {c}" for c in range(len(chunks))])
    # 3. the plan
    programs = plan["programs"]["_plan_tiles_kernel"]
    y += 0.9
    header(
        y,
        f"3. plan: {programs} programs, each reading every chunk's sums",
        f"program p: chunk p's block offsets and the experts of tiles "
        f"{PLAN_SIZES['PLAN_TILE_CHUNK']}p ..; program 0 also the padding and num_padded",
    )
    y = table(y + 1.0, [counts, tiles], ["pairs of e (all chunks)", f"tiles: ⌈pairs / {block_m}⌉"])
    offsets = plan["block_offsets"].tolist()
    shown = [[c > 0 for c in row] for row in blocks]
    y = table(y + 0.65, offsets, [f"block {b} starts at slot" for b in range(len(offsets))], shown)
    ax.text(
        left + experts * cw + 0.3,
        y - len(offsets) * ch / 2,
        "where each block's pairs of e begin:\ne's run start + its pairs in earlier blocks\n"
        "(grey: the block has none of e)",
        fontsize=9.5,
        va="center",
        color="#333333",
    )
    # 4. the scatter, and the slots
    y += 0.9
    header(
        y,
        f"4. scatter: {plan['programs']['_scatter_pairs_kernel']} programs, a block each",
        "a pair goes to its block's offset for its expert plus the block's earlier pairs with "
        f"that expert; {pairs} (the pair count) marks padding",
    )
    slot_w, top = 0.98, y + 1.55
    capacity = len(plan["expert_ids"])
    for tile, expert in enumerate(plan["expert_ids"]):
        x = 0.2 + tile * block_m * slot_w
        used = expert >= 0
        label = f"tile {tile}: e{expert}" if used else f"tile {tile}: -1"
        ax.text(
            x + block_m * slot_w / 2,
            top - 0.12,
            label,
            ha="center",
            va="bottom",
            fontsize=9.5,
            color=EXPERT_COLORS[expert] if used else "#777777",
            fontweight="bold",
        )
        for s in range(block_m):
            slot = tile * block_m + s
            value = plan["sorted_ids"][slot]
            if not used:  # a slot past the expert's padded run
                fill, text, style = LIGHT, "·", {"color": "#999999"}
            elif value == pairs:  # padding: the placeholder id
                fill, text, style = GREY, f"{value}", {"color": "white"}
            else:
                fill, text = EXPERT_COLORS[expert], f"{value}"
                style = {"color": "white", "fontweight": "bold"}
            box(ax, x + s * slot_w, top, slot_w, 0.8, fill, text, fontsize=10, **style)
            ax.text(
                x + s * slot_w + slot_w / 2,
                top + 0.95,
                f"{slot}",
                ha="center",
                va="top",
                fontsize=7.5,
                color="#777777",
            )
    ax.text(
        0.2,
        top + 1.55,
        f"sorted_ids: {capacity} tiles of {block_m} slots = max_tiles({pairs}, {experts}, "
        f"{block_m}), sized before the routing is known; this routing fills "
        f"{plan['used']} (num_padded, left on the device). Coloured: a pair index, placed "
        f"by the scatter;\ngrey {pairs}: padding, written by the plan; dots: slots past "
        f"num_padded, never written, and tiles with expert -1, whose programs return at once. "
        f"The order is chapter 20's moe_align_block_size's.",
        fontsize=9.5,
        va="top",
        color="#333333",
    )
    return fig
