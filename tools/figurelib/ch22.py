"""Chapter 22's figure: decode_step_kernels.svg, profile_decode.py's recorded H200 runs: one
decode step's kernels by kind.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .common import COLORS, ROOT, figure

DECODE_PROFILE = ROOT / "benchmark/results/profile_decode_h200_2026-12-02.json"  # measured
FUSED_PROFILE = ROOT / "benchmark/results/profile_decode_fused_h200_2026-12-02.json"


@figure("ch22", "decode_step_kernels")
def decode_step_kernels() -> plt.Figure:
    """profile_decode.py's H200 runs before and after chapter 22's kernels: one decode step's
    kernels grouped by kind, their time (with the share of the step's kernel time), their number."""
    import json

    runs = [("torch's norms and sampler", json.loads(DECODE_PROFILE.read_text("utf-8"))),
            ("chapter 22's fused kernels", json.loads(FUSED_PROFILE.read_text("utf-8")))]
    kinds = sorted({r["kind"] for _, run in runs for r in run["rows"]},
                   key=lambda kind: _kind_row(runs[0][1], kind)["us"])  # the largest on top
    first = runs[0][1]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.2), layout="constrained",
                                      sharey=True)
    fig.suptitle(f"One decode step of {first['shape']} at batch {first['batch']}, "
                 f"{first['context']} cached tokens each, on an {first['gpu']}, {first['date']}")
    height, ys = 0.4, range(len(kinds))
    for n, (label, run) in enumerate(runs):
        rows = [_kind_row(run, kind) for kind in kinds]
        at = [y + (0.5 - n) * height for y in ys]
        left.barh(at, [r["us"] for r in rows], height, color=COLORS[n],
                  label=f"{label}: {run['kernel_us']:,.0f} us in a {run['step_us'] / 1e3:.1f} ms "
                        "step")
        right.barh(at, [r["kernels"] for r in rows], height, color=COLORS[n],
                   label=f"{label}: {run['kernels']:,} kernels")
        for y, r in zip(at, rows):
            left.text(r["us"] + 60, y, f"{r['us']:,.0f} us ({r['share']:.1%})", va="center",
                      fontsize=8)
            right.text(r["kernels"] + 8, y, f"{r['kernels']:,}", va="center", fontsize=8)
    left.set_yticks(list(ys), kinds)
    left.set_xlim(0, max(r["us"] for _, run in runs for r in run["rows"]) * 1.45)
    right.set_xlim(0, max(r["kernels"] for _, run in runs for r in run["rows"]) * 1.25)
    left.set_xlabel("kernel time in the step (us)")
    right.set_xlabel("kernels launched in the step")
    for ax in (left, right):
        ax.grid(alpha=0.3, axis="x")
        ax.legend(loc="lower right", fontsize=9)
    return fig


def _kind_row(run: dict, kind: str) -> dict:
    """The run's row for `kind`; none when no kernel of that kind ran."""
    return next((r for r in run["rows"] if r["kind"] == kind),
                {"kind": kind, "kernels": 0, "us": 0.0, "share": 0.0})
