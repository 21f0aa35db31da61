"""Chapter 9's figure: budget.svg, what the prefill budget bounds and what it does not, from the
chunked-prefill runs recorded in benchmark/results (bench_stage2.py chunked on chapter 9's tree).
"""

from __future__ import annotations

import re
import statistics

import matplotlib.pyplot as plt

from .common import COLORS, ROOT, figure

CHUNKED_RUNS = ROOT / "benchmark/results/chunked_cpu_2026-12-07.txt"  # measured, not computed here
ROW = re.compile(r"^\s*(\d+)\s+\d+\s+\d+\s+\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")


def chunked_runs() -> dict[int, list[tuple[float, float, float]]]:
    """Budget -> (longest step ms, longest wait for a token ms, whole run s), one per run."""
    runs: dict[int, list[tuple[float, float, float]]] = {}
    for line in CHUNKED_RUNS.read_text().splitlines():
        if match := ROW.match(line):
            budget, *times = match.groups()
            runs.setdefault(int(budget), []).append(tuple(float(t) for t in times))
    return runs


@figure("ch09", "budget", recorded=True)
def budget() -> plt.Figure:
    """Median and range of the runs for each budget: the longest step and the longest wait of a
    running request for its next token, and the whole run."""
    runs = chunked_runs()
    budgets = sorted(runs)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained")
    fig.suptitle(
        f"A 2048-token prompt among 8 decoding requests, {len(runs[budgets[0]])} runs on "
        "chapter 9's tree: median and range"
    )
    series = [
        (left, 0, "longest step", COLORS[0]),
        (left, 1, "longest wait of a running request for a token", COLORS[3]),
        (right, 2, "whole run", COLORS[2]),
    ]
    for ax, column, label, color in series:
        values = [[run[column] for run in runs[b]] for b in budgets]
        medians = [statistics.median(v) for v in values]
        low = [m - min(v) for m, v in zip(medians, values)]
        high = [max(v) - m for m, v in zip(medians, values)]
        ax.errorbar(budgets, medians, yerr=[low, high], marker="o", capsize=4, color=color)
        ax.plot([], [], marker="o", color=color, label=label)
    left.set_ylabel("ms (process CPU time)")
    right.set_ylabel("s (process CPU time)")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_xlabel("budget: prompt tokens a prefill forward may run (max_extend_tokens)")
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper center", frameon=False)
        ax.spines[["top", "right"]].set_visible(False)
    return fig
