"""Chapter 22's figures: decode_step_kernels.svg, profile_decode.py's recorded H200 runs (one
decode step's kernels by kind), and throughput_by_chapter.svg, chapter 15's figure carried on to
this chapter with the peers' published figures beside it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .ch15 import H200_RESULTS
from .common import COLORS, GREY, ROOT, figure

DECODE_PROFILE = ROOT / "benchmark/results/profile_decode_h200_2026-12-02.json"  # measured
H200_CHAPTERS = ROOT / "benchmark/results/h200_chapters_2026-12-02.json"  # measured
FUSED_PROFILE = ROOT / "benchmark/results/profile_decode_fused_h200_2026-12-03.json"


@figure("ch22", "decode_step_kernels", recorded=True)
def decode_step_kernels() -> plt.Figure:
    """profile_decode.py's H200 runs before and after chapter 22's kernels: one decode step's
    kernels grouped by kind, their time (with the share of the step's kernel time), their number."""
    import json

    runs = [
        ("torch's norms, rotary and sampler", json.loads(DECODE_PROFILE.read_text("utf-8"))),
        ("chapter 22's fused kernels", json.loads(FUSED_PROFILE.read_text("utf-8"))),
    ]
    kinds = sorted(
        {r["kind"] for _, run in runs for r in run["rows"]},
        key=lambda kind: _kind_row(runs[0][1], kind)["us"],
    )  # the largest on top
    first = runs[0][1]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.2), layout="constrained", sharey=True)
    dates = ", ".join(sorted({run["date"] for _, run in runs}))
    fig.suptitle(
        f"One decode step of {first['shape']}, {first['batch']} requests x "
        f"{first['context']} cached tokens, {first['gpu']} ({dates})",
        fontsize=11,
    )
    height, ys = 0.4, range(len(kinds))
    for n, (label, run) in enumerate(runs):
        rows = [_kind_row(run, kind) for kind in kinds]
        at = [y + (0.5 - n) * height for y in ys]
        left.barh(
            at,
            [r["us"] for r in rows],
            height,
            color=COLORS[n],
            label=f"{label}: {run['kernel_us']:,.0f} us in a {run['step_us'] / 1e3:.1f} ms step",
        )
        right.barh(
            at,
            [r["kernels"] for r in rows],
            height,
            color=COLORS[n],
            label=f"{label}: {run['kernels']:,} kernels",
        )
        for y, r in zip(at, rows):
            left.text(
                r["us"] + 60, y, f"{r['us']:,.0f} us ({r['share']:.1%})", va="center", fontsize=8
            )
            right.text(r["kernels"] + 8, y, f"{r['kernels']:,}", va="center", fontsize=8)
    left.set_yticks(list(ys), kinds)
    left.set_xlim(0, max(r["us"] for _, run in runs for r in run["rows"]) * 1.45)
    right.set_xlim(0, max(r["kernels"] for _, run in runs for r in run["rows"]) * 1.25)
    left.set_xlabel("kernel time in the step (us)")
    right.set_xlabel("kernels launched in the step")
    for ax in (left, right):
        ax.grid(alpha=0.3, axis="x")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=9)
    return fig


def _kind_row(run: dict, kind: str) -> dict:
    """The run's row for `kind`; none when no kernel of that kind ran."""
    return next(
        (r for r in run["rows"] if r["kind"] == kind),
        {"kind": kind, "kernels": 0, "us": 0.0, "share": 0.0},
    )


# the record's run labels as the figure shows them: the bar at chapter 21's place ran ch22's code
LABELS = {"ch18-21: overlap on, ch22's kernels off": "ch22's code, overlap on, its kernels off"}


@figure("ch22", "throughput_by_chapter", recorded=True)
def throughput_by_chapter_to_22() -> plt.Figure:
    """Chapter 15's figure carried on to chapter 22: output tokens/s on nano-vllm's workload on
    an H200, chapter by chapter (chapter 15's record for chapters 15-17, this chapter's call for
    the rest and transformers), under the bandwidth floor, beside the peers' published figures
    (another GPU: scaled by memory bandwidth, drawn as lines)."""
    import json
    import textwrap

    early = json.loads(H200_RESULTS.read_text(encoding="utf-8"))
    record = json.loads(H200_CHAPTERS.read_text(encoding="utf-8"))
    runs = [{**r, "date": early["date"]} for r in early["runs"] if r["chapter"]]
    runs += [
        {**r, "date": record["date"], "label": LABELS.get(r["label"], r["label"])}
        for r in record["runs"]
    ]
    runs.sort(key=lambda r: r["chapter"] or 99)  # transformers last
    rates = [r["tokens_per_s"] for r in runs]
    fig, ax = plt.subplots(figsize=(11, 6), layout="constrained")
    fig.suptitle("Output tokens/s on one H200, chapter by chapter, Qwen3-0.6B's shape")
    x = range(len(runs))
    colors = [
        COLORS[0] if r["date"] == early["date"] else COLORS[1] if r["chapter"] else GREY
        for r in runs
    ]
    bars = ax.bar(x, rates, color=colors, width=0.6)
    for bar, run in zip(bars, runs):
        if not run["scope"].startswith("whole workload"):
            bar.set_hatch("//")
            bar.set_edgecolor("white")
    for i, rate in zip(x, rates):
        ax.text(i, rate * 1.08, f"{rate:,}", ha="center", fontsize=9)
    floor = record["floor_tokens_per_s"]
    ax.axhline(
        floor,
        color=COLORS[3],
        linestyle="--",
        label=f"bandwidth floor: {floor:,} (ch15's main, 4,800 GB/s)",
    )
    for n, peer in enumerate(record["peers"]):
        ax.axhline(
            peer["scaled_tokens_per_s"],
            color=COLORS[4 + n],
            linestyle=":",
            label=textwrap.fill(
                f"{peer['label']}: {peer['tokens_per_s']:,} on "
                f"{peer['gpu']}, x{peer['scale']:.2f} for the H200's "
                f"bandwidth = {peer['scaled_tokens_per_s']:,}",
                70,
            ),
        )
    ax.set_yscale("log")
    ax.set_ylim(50, floor * 12)  # room above the floor for the legend
    ax.set_xticks(list(x), [textwrap.fill(r["label"], 18) for r in runs], fontsize=8)
    ax.set_ylabel("output tokens/s (log scale)")
    ax.set_title(
        f"{record['model']}; nano-vllm's workload\nblue: chapter 15's record "
        f"({early['date']}); hatched: a slice of the workload\norange: the book's package at "
        f"931554f (chapters 1-22), the runs taking turns on one machine on {record['date']}",
        fontsize=10,
    )
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3, axis="y", which="both")
    return fig
