"""Chapter 15's figures: workload_floor.svg (the benchmark's workload and the bandwidth floor)
and throughput_by_chapter.svg (the recorded H200 runs).
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .common import COLORS, GREY, ROOT, figure


@figure("ch15", "workload_floor")
def workload_floor() -> plt.Figure:
    """nano-vllm's workload as ch15's main draws it, and the bandwidth floor of a decode step of
    Qwen3-0.6B in bf16 on an H200 (4,800 GB/s) by batch size, from the main's arithmetic."""
    from ch15_measure import (
        SHAPES,
        decode_floor_s,
        kv_bytes_per_token,
        nano_vllm_workload,
        weight_bytes,
    )

    prompts, params = nano_vllm_workload()
    ins, outs = [len(p) for p in prompts], [p.max_tokens for p in params]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained")
    fig.suptitle("The benchmark's workload, and the fastest a decode step can be")
    bins = list(range(100, 1025, 50)) + [1025]
    left.hist(
        [ins, outs],
        bins=bins,
        color=COLORS[:2],
        label=[f"input: {sum(ins):,} tokens", f"output: {sum(outs):,} tokens"],
    )
    left.set_xlabel("tokens per sequence")
    left.set_ylabel("sequences")
    left.set_title(
        "nano-vllm's 256 sequences (random.seed(0)):\nlengths uniform in 100..1024", fontsize=10
    )
    left.legend(fontsize=9)
    config = SHAPES["qwen3-0.6b"]
    weights, kv = weight_bytes(config), kv_bytes_per_token(config)
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    for color, context in zip(COLORS[2:], (256, 1024, 2048)):
        rates = [b / decode_floor_s(weights, kv, b * context, 4.8e12) for b in batches]
        right.plot(
            batches,
            rates,
            "o-",
            color=color,
            label=f"every sequence at {context:,} tokens of context",
        )
    weights_only = [b / decode_floor_s(weights, kv, 0, 4.8e12) for b in batches]
    right.plot(batches, weights_only, "--", color=GREY, label="weights alone (no KV read)")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xticks(batches, [str(b) for b in batches])
    right.set_xlabel("sequences decoded together (batch size)")
    right.set_ylabel("output tokens/s at the floor")
    right.set_title(
        f"Qwen3-0.6B in bf16 ({weights / 1e9:.2f} GB of weights, "
        f"{kv / 1024:.0f} KiB of KV a token),\nan H200 reading 4,800 GB/s",
        fontsize=10,
    )
    right.legend(fontsize=9)
    right.grid(alpha=0.3, which="both")
    return fig


H200_RESULTS = ROOT / "benchmark/results/h200_2026-12-01.json"  # measured, not computed here


@figure("ch15", "throughput_by_chapter", recorded=True)
def throughput_by_chapter() -> plt.Figure:
    """The H200 runs recorded in benchmark/results: output tokens/s of each chapter's engine and
    of transformers on nano-vllm's workload, under the bandwidth floor of ch15's main."""
    import json
    import textwrap

    record = json.loads(H200_RESULTS.read_text(encoding="utf-8"))
    runs = sorted(record["runs"], key=lambda r: r["chapter"] or 99)  # transformers last
    floor = record["floor_tokens_per_s"]
    rates = [r["tokens_per_s"] for r in runs]
    partial = [not r["scope"].startswith("whole workload") for r in runs]
    colors = [COLORS[i] if r["chapter"] else GREY for i, r in enumerate(runs)]
    fig, ax = plt.subplots(figsize=(10, 5.6), layout="constrained")
    fig.suptitle(f"Output tokens/s on an H200, chapter by chapter ({record['date']})")
    x = range(len(runs))
    bars = ax.bar(x, rates, color=colors, width=0.6)
    for bar, cut in zip(bars, partial):
        if cut:  # another slice of the workload: drawn hatched and footnoted
            bar.set_hatch("//")
            bar.set_edgecolor("white")
    for i, run, cut in zip(x, runs, partial):
        median = " (median)" if len(run.get("runs", [])) > 1 else ""
        label = f"{run['tokens_per_s']:,}{median}" + (" *" if cut else "")
        ax.text(i, run["tokens_per_s"] * 1.12, label, ha="center", fontsize=10)
    ax.axhline(
        floor,
        color=COLORS[3],
        linestyle="--",
        label=f"bandwidth floor: {floor:,} (ch15's main, 4,800 GB/s)",
    )
    ax.set_yscale("log")
    ax.set_ylim(50, floor * 2.5)
    ax.set_xticks(list(x), [textwrap.fill(r["label"], 20) for r in runs], fontsize=9)
    ax.set_ylabel("output tokens/s (log scale)")
    last = runs[-2]  # the last chapter's engine, before transformers
    baseline = runs[-1]["tokens_per_s"]
    same_run = last["same_run_as_transformers"]
    ax.set_title(
        f"{record['model']}; nano-vllm's workload\nchapter {last['chapter']}: "
        f"{last['tokens_per_s']:,}, {100 * last['tokens_per_s'] / floor:.0f}% of the floor; in "
        f"the run that timed both, {same_run:,} against transformers' {baseline:,}: "
        f"{same_run / baseline:.0f}x",
        fontsize=10,
    )
    notes = [f"* {r['scope']}" for r, cut in zip(runs, partial) if cut]
    ax.text(0.01, 0.97, "\n".join(notes), transform=ax.transAxes, va="top", fontsize=9)
    ax.legend(loc="upper right", fontsize=9)
    ax.grid(alpha=0.3, axis="y", which="both")
    return fig
