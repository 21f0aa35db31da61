"""Chapter 21's figure: moe_layer_time.svg, bench_moe.py's recorded H200 run against the
roofline.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .common import COLORS, GREY, ROOT, arrow, diagram, figure

MOE_RESULTS = ROOT / "benchmark/results/moe_h200_2026-12-01.json"  # measured, not computed here


@figure("ch21", "moe_layer_time")
def moe_layer_time() -> plt.Figure:
    """bench_moe.py's H200 run: the whole MoE layer's time per token count for chapter 20's
    backend, the tuned baseline, chapter 21's and the roofline; and each over the roofline."""
    import json

    record = json.loads(MOE_RESULTS.read_text(encoding="utf-8"))
    tokens, ms = record["tokens"], record["ms"]
    styles = {
        "ch20 fused": (GREY, "s-"),
        "tuned baseline": (COLORS[1], "^-"),
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
    for name in ("tuned baseline", "ch21 fast"):
        color, style = styles[name]
        over = [t / r for t, r in zip(ms[name], ms["roofline"])]
        right.plot(tokens, over, style, color=color, label=name, markersize=4)
    right.axhline(
        1.5, color=COLORS[3], linestyle=":", label="1.5x the roofline (the aim, T <= 512)"
    )
    right.set_xscale("log", base=2)
    right.set_ylim(1, 5)
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
DTYPES = {"torch.bfloat16": "bf16", "torch.float32": "fp32", "torch.int32": "int32"}


def moe_launches(num_tokens: int, shape: dict) -> tuple[list[tuple[str, tuple, dict]], dict]:
    """The launches SyncFreeMoeBackend.forward_with makes for num_tokens tokens at shape (a
    config.json's keys), with the H200 file's config for that count: (kernel, grid,
    {argument: (shape, dtype)}) each. Tensors are on torch's meta device and every kernel is
    replaced by a recorder while the forward runs, so nothing is computed."""
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
