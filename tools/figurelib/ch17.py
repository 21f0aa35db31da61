"""Chapter 17's figure: padding.svg, the captured CUDA-graph sizes and the dummy rows each
decode batch is padded with.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .common import COLORS, GREY, figure


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
    left.step(near, padded[: len(near)], ".-", where="post", color=COLORS[0],
              label="the graph it replays (padded size)")
    left.plot(near, near, "--", color=GREY, label="the batch itself")
    captured = [s for s in sizes if s <= 40]
    first = ", ".join(map(str, captured[:5]))
    left.plot(captured, captured, "o", color=COLORS[1], label=f"captured sizes: {first} ...")
    left.set_xlabel("decode batch size")
    left.set_ylabel("rows run")
    left.set_title("Batches 1 to 40: a batch runs the smallest captured size that holds it",
                   fontsize=10)
    left.legend(fontsize=9, loc="upper left")
    left.grid(alpha=0.3)
    share = 100 * sum(dummy) / sum(padded)
    right.bar(batches, dummy, width=1.0, color=COLORS[3])
    right.set_xlabel("decode batch size")
    right.set_ylabel("dummy rows")
    right.set_xticks([1, 32, 64, 96, 128, 160, 192, 224, 256])
    right.set_title(f"Dummy rows: at most {max(dummy)}, {sum(dummy) / len(batches):.2f} on "
                    f"average;\n{share:.1f}% of all rows run over batches 1..256", fontsize=10)
    right.grid(alpha=0.3, axis="y")
    return fig
