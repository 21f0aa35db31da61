"""Chapter 21's figure: moe_layer_time.svg, bench_moe.py's recorded H200 run against the
roofline.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .common import COLORS, GREY, ROOT, figure

MOE_RESULTS = ROOT / "benchmark/results/moe_h200_2026-12-01.json"  # measured, not computed here


@figure("ch21", "moe_layer_time")
def moe_layer_time() -> plt.Figure:
    """bench_moe.py's H200 run: the whole MoE layer's time per token count for chapter 20's
    backend, the tuned baseline, chapter 21's and the roofline; and each over the roofline."""
    import json

    record = json.loads(MOE_RESULTS.read_text(encoding="utf-8"))
    tokens, ms = record["tokens"], record["ms"]
    styles = {"ch20 fused": (GREY, "s-"), "tuned baseline": (COLORS[1], "^-"),
              "ch21 fast": (COLORS[0], "o-"), "roofline": (COLORS[3], "--")}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5), layout="constrained")
    shape = record["shape"]
    fig.suptitle(f"Qwen3-30B-A3B's MoE layer on an {record['device']} "
                 f"(E={shape['experts']}, top-{shape['topk']}, H={shape['hidden']}, "
                 f"I={shape['inter']}, bf16), {record['date'][:10]}")
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
    right.axhline(1.5, color=COLORS[3], linestyle=":",
                  label="1.5x the roofline (the aim, T <= 512)")
    right.set_xscale("log", base=2)
    right.set_ylim(1, 5)
    right.set_xlabel("tokens in the batch")
    right.set_ylabel("time / roofline")
    ceil = record["ceilings"]
    right.set_title(f"over the roofline: max(weights touched / {ceil['copy_tbps']:.2f} TB/s, "
                    f"FLOPs / {ceil['peak_tflops']:.0f} TFLOP/s)", fontsize=10)
    right.legend(fontsize=9)
    right.grid(alpha=0.3, which="both")
    return fig
