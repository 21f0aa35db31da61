"""Chapter 17's figures: padding.svg, the captured CUDA-graph sizes and the dummy rows each
decode batch is padded with; launches.svg, one decode step launched kernel by kernel against
the same step replayed as one graph.
"""

from __future__ import annotations

import json
import tempfile

import matplotlib.pyplot as plt

from .common import COLORS, GREY, LIGHT, ROOT, figure, quietly, tiny_model

DECODE_PROFILE = ROOT / "benchmark/results/profile_decode_h200_2026-12-02.json"  # measured
H200_RESULTS = ROOT / "benchmark/results/h200_2026-12-01.json"  # measured
# Measured on H200s on 2026-12-01 and recorded in benchmark/README.md ("H200, 2026-12-01"):
# graphs alone, before the fused rms_norm, ran the workload at 11,292 tokens/s on another
# machine than chapter 16's run (so the saving below is good to some 15%); its --breakdown gave
# 1,023 decode steps and a decode forward of 8.27 ms; a profile of one decode step at batch 256
# counted 1,938 kernels.
GRAPHS_ALONE_TOKENS_PER_S = 11292
DECODE_STEPS = 1023
GRAPH_FORWARD_MS = 8.27
KERNELS_PER_STEP = 1938
OUTPUT_TOKENS = 133966  # nano-vllm's workload, printed by benchmark/offline.py


@figure("ch17", "padding")
def graph_padding() -> plt.Figure:
    """The captured sizes up to 256 and, for every decode batch of 1..256, the graph it runs
    and the dummy rows that pads it, from graph_batch_sizes and padded_size."""
    from minisgl.engine.graph import graph_batch_sizes, padded_size

    sizes = graph_batch_sizes(256)
    batches = list(range(1, 257))
    padded = [padded_size(sizes, b) or 0 for b in batches]
    dummy = [p - b for p, b in zip(padded, batches)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained")
    fig.suptitle(f"{len(sizes)} CUDA graphs serve every decode batch of 1 to 256")
    near = [b for b in batches if b <= 40]
    left.step(
        near,
        padded[: len(near)],
        ".-",
        where="post",
        color=COLORS[0],
        label="the graph it replays (padded size)",
    )
    left.plot(near, near, "--", color=GREY, label="the batch itself")
    captured = [s for s in sizes if s <= 40]
    first = ", ".join(map(str, captured[:5]))
    left.plot(captured, captured, "o", color=COLORS[1], label=f"captured sizes: {first} ...")
    left.set_xlabel("decode batch size")
    left.set_ylabel("rows run")
    left.set_title(
        "Batches 1 to 40: a batch runs the smallest captured size that holds it", fontsize=10
    )
    left.legend(fontsize=9, loc="upper left")
    left.grid(alpha=0.3)
    share = 100 * sum(dummy) / sum(padded)
    right.bar(batches, dummy, width=1.0, color=COLORS[3])
    right.set_xlabel("decode batch size")
    right.set_ylabel("dummy rows")
    right.set_xticks([1, 32, 64, 96, 128, 160, 192, 224, 256])
    right.set_title(
        f"Dummy rows: at most {max(dummy)}, {sum(dummy) / len(batches):.2f} on "
        f"average;\n{share:.1f}% of all rows run over batches 1..256",
        fontsize=10,
    )
    right.grid(alpha=0.3, axis="y")
    return fig


def layer_kernels(path: str) -> list[str]:
    """The kernels one decoder layer (layer 1) of the tiny Qwen3 launches in a bf16 decode step
    on a CPU, in order, each tagged "norm", "rope", "attention", "GEMM" or "other" by the code
    that ran it (attention is the CPU's torch reference here, Triton's kernels on a GPU).
    A kernel is an aten op that writes memory: in place, or into a tensor none of its inputs'
    storage holds (views and no-op casts launch nothing)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from minisgl.core import SamplingParams
    from minisgl.layers import attention, norm, rotary
    from minisgl.llm import LLM
    from minisgl.models.decoder import DecoderLayer

    tag = ["other"]
    layers: list[list[str]] = []

    class Kernels(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            ins = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            outs = out if isinstance(out, (tuple, list)) else [out]
            writes = any(
                r.alias_info is not None and r.alias_info.is_write for r in func._schema.returns
            )
            new = any(
                isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in ins
                for o in outs
            )
            if writes or new:
                name = func.overloadpacket.__name__
                layers[-1].append("GEMM" if name in ("linear", "mm", "addmm") else tag[0])
            return out

    def tagged(fn, name: str):
        def run(*args, **kwargs):
            tag[0] = name
            try:
                return fn(*args, **kwargs)
            finally:
                tag[0] = "other"

        return run

    real_layer, real_norm, real_rope = (
        DecoderLayer.forward,
        norm.rms_norm,
        rotary.RotaryEmbedding.forward,
    )
    real_attn = attention.AttentionLayer.forward

    def layer(self, *args, **kwargs):
        layers.append([])
        with Kernels():
            return real_layer(self, *args, **kwargs)

    llm = LLM(path, device="cpu", page_size=4, dtype=torch.bfloat16)
    DecoderLayer.forward, norm.rms_norm = layer, tagged(real_norm, "norm")
    rotary.RotaryEmbedding.forward = tagged(real_rope, "rope")
    attention.AttentionLayer.forward = tagged(real_attn, "attention")
    try:
        llm.generate(
            [[3, 1, 4, 1, 5], [2, 7, 1, 8]], [SamplingParams(max_tokens=2, ignore_eos=True)] * 2
        )
    finally:
        DecoderLayer.forward, norm.rms_norm, rotary.RotaryEmbedding.forward = (
            real_layer,
            real_norm,
            real_rope,
        )
        attention.AttentionLayer.forward = real_attn
    num_layers = llm.scheduler.engine.model.config.num_layers
    return layers[-num_layers + 1]  # the last step's layer 1: a decode step, with a residual


def eager_times(launch: float, gpu: list[float]) -> tuple[list[float], float]:
    """Each kernel starts once its launch is issued (launch after launch, ``launch`` apart on
    the host) and the kernel before it is done; its starts, and the end of the last."""
    starts, done = [], 0.0
    for i, g in enumerate(gpu):
        starts.append(max((i + 1) * launch, done))
        done = starts[-1] + g
    return starts, done


@figure("ch17", "launches")
def launch_timeline() -> plt.Figure:
    """One decode step of Qwen3-0.6B at batch 256 on the H200, eager against one graph replay.
    Totals from chapter 17's measurements; the zoom's kernels are those of a decoder layer as
    the code runs them (a CPU run of the tiny Qwen3), their GPU times the recorded profile's
    means by kind, the launch time the chapter's estimate per kernel."""
    with tempfile.TemporaryDirectory() as tmp:
        kinds = quietly(layer_kernels, tiny_model("qwen3", tmp))
    profile = {r["kind"]: r for r in json.loads(DECODE_PROFILE.read_text())["rows"]}
    mean_us = {k: profile[k]["us"] / profile[k]["kernels"] for k in ("GEMM", "elementwise/copy")}
    eager_tps = next(
        r["tokens_per_s"]
        for r in json.loads(H200_RESULTS.read_text())["runs"]
        if r["chapter"] == 16
    )
    saved_ms = 1000 * (OUTPUT_TOKENS / eager_tps - OUTPUT_TOKENS / GRAPHS_ALONE_TOKENS_PER_S)
    saved_ms /= DECODE_STEPS
    eager_ms = saved_ms + GRAPH_FORWARD_MS  # the host's launching, the GPU's work underneath
    launch_us = 1000 * eager_ms / KERNELS_PER_STEP

    fig, (whole, zoom) = plt.subplots(
        2, 1, figsize=(12, 7.4), layout="constrained", height_ratios=[1, 1.25]
    )
    fig.suptitle(
        f"One decode step at batch 256: {KERNELS_PER_STEP:,} launches from the host, "
        "or one graph replay"
    )
    rows = {"eager: host": 3.5, "eager: device": 2.5, "graph: host": 1.2, "graph: device": 0.2}
    h = 0.7

    # the whole step, as totals
    whole.broken_barh([(0, eager_ms)], (rows["eager: host"], h), facecolors=COLORS[0])
    whole.text(
        eager_ms / 2,
        rows["eager: host"] + h / 2,
        f"{KERNELS_PER_STEP:,} launches, ~{launch_us:.0f} us each: ~{eager_ms:.0f} ms",
        ha="center",
        va="center",
        color="white",
        fontsize=10,
    )
    whole.broken_barh(
        [(0, eager_ms)],
        (rows["eager: device"], h),
        facecolors=LIGHT,
        edgecolor=COLORS[2],
        hatch="||||",
        linewidth=0,
    )
    whole.text(
        eager_ms / 2,
        rows["eager: device"] + h / 2,
        f"{GRAPH_FORWARD_MS} ms of kernels ({100 * GRAPH_FORWARD_MS / eager_ms:.0f}%) "
        "scattered over the launches, idle between",
        ha="center",
        va="center",
        fontsize=10,
        bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
    )
    whole.plot([0, 0], [rows["graph: host"], rows["graph: host"] + h], color=COLORS[1], lw=4)
    whole.text(
        0.4,
        rows["graph: host"] + h / 2,
        "one replay() call; the host is free after it",
        va="center",
        fontsize=10,
    )
    whole.broken_barh([(0, GRAPH_FORWARD_MS)], (rows["graph: device"], h), facecolors=COLORS[2])
    whole.text(
        GRAPH_FORWARD_MS + 0.4,
        rows["graph: device"] + h / 2,
        f"the same {KERNELS_PER_STEP:,} kernels back to back: {GRAPH_FORWARD_MS} ms",
        va="center",
        fontsize=10,
    )
    whole.annotate(
        "",
        xy=(GRAPH_FORWARD_MS, 2.05),
        xytext=(eager_ms, 2.05),
        arrowprops={"arrowstyle": "<->", "color": COLORS[3]},
    )
    whole.text(
        (GRAPH_FORWARD_MS + eager_ms) / 2,
        2.1,
        f"~{saved_ms:.0f} ms saved a step (runs on two machines)",
        ha="center",
        va="bottom",
        color=COLORS[3],
        fontsize=10,
    )
    whole.axvline(eager_ms, color=GREY, ls="--", lw=1)
    whole.set_xlim(-0.5, eager_ms * 1.04)
    whole.set_title("The whole step (totals)", fontsize=11)
    whole.set_xlabel("time in the step, ms")

    # the zoom: the first kernels of one decoder layer, to scale
    n = 40
    colours = {"norm": COLORS[0], "rope": COLORS[4], "GEMM": COLORS[1], "other": COLORS[7]}
    first = kinds[:n]
    assert "attention" not in first, "the zoom shows kernels that run the same on a GPU"
    gpu_ms = [mean_us["GEMM" if k == "GEMM" else "elementwise/copy"] / 1000 for k in first]
    starts, eager_end = eager_times(launch_us / 1000, gpu_ms)
    for i, kind in enumerate(first):
        zoom.broken_barh(
            [(i * launch_us / 1000, launch_us / 1000)],
            (rows["eager: host"], h),
            facecolors=colours[kind],
            edgecolor="white",
            linewidth=0.8,
        )
    zoom.broken_barh(
        list(zip(starts, gpu_ms)),
        (rows["eager: device"], h),
        facecolors=[colours[k] for k in first],
    )
    t, graph = 0.0, []
    for g in gpu_ms:
        graph.append((t, g))
        t += g
    zoom.plot([0, 0], [rows["graph: host"], rows["graph: host"] + h], color=COLORS[1], lw=4)
    zoom.text(0.005, rows["graph: host"] + h / 2, "replay()", va="center", fontsize=10)
    zoom.broken_barh(
        graph,
        (rows["graph: device"], h),
        facecolors=[colours[k] for k in first],
        edgecolor="white",
        linewidth=0.3,
    )
    zoom.text(
        t + 0.005,
        rows["graph: device"] + h / 2,
        f"the same {n} kernels back to back: {t:.3f} ms",
        va="center",
        fontsize=10,
    )
    zoom.text(
        eager_end,
        rows["eager: device"] - 0.15,
        f"eager: {eager_end:.3f} ms for {n} kernels",
        ha="right",
        va="top",
        fontsize=10,
    )
    names = {
        "norm": "RMSNorm formula and weight",
        "rope": "rope",
        "GEMM": "GEMM",
        "other": "residual add, SiLU, ...",
    }
    for kind, colour in colours.items():
        count = sum(k == kind for k in kinds)
        zoom.broken_barh(
            [(0, 0)], (0, 0), facecolors=colour, label=f"{names[kind]}: {count} a layer"
        )
    zoom.legend(loc="upper right", fontsize=9, ncols=4, bbox_to_anchor=(1, 1.16), frameon=False)
    zoom.set_xlim(-0.01, eager_end * 1.03)
    zoom.set_title(f"Zoom: a decoder layer's first {n} kernels, to scale", fontsize=11, loc="left")
    zoom.set_xlabel(
        f"time, ms (a launch ~{launch_us:.0f} us; a kernel on the GPU "
        f"{mean_us['elementwise/copy']:.1f} us elementwise, "
        f"{mean_us['GEMM']:.1f} us GEMM)"
    )
    for ax in (whole, zoom):
        ax.set_yticks([y + h / 2 for y in rows.values()], list(rows))
        ax.set_ylim(-0.1, 4.4)
        ax.grid(alpha=0.3, axis="x")
        ax.tick_params(axis="y", length=0)
    return fig
