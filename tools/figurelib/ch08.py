"""Chapter 8's figure: radix_split.svg, the radix tree before and after an edge splits
(``draw_tree`` draws one tree).
"""

from __future__ import annotations

import tempfile
from typing import Callable

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from .common import COLORS, figure, tiny_model


def draw_tree(ax: Axes, cache, decode: Callable[[list[int]], str], title: str) -> None:
    """The radix tree left to right, one box per node: its tokens, slots and references."""
    rows: list[tuple[int, object]] = []  # (depth, node) in drawing order

    def walk(node, depth: int) -> None:
        for child in node.children.values():
            rows.append((depth, child))
            walk(child, depth + 1)

    walk(cache.root, 0)
    where = {}
    ax.text(0, 0.5, "root", va="center", fontweight="bold")
    for row, (depth, node) in enumerate(rows, 1):
        x, y = 0.6 + depth * 4.2, row
        slots = node.value.tolist()
        text = f"{decode(node.key)!r}\nslots {slots[0]}–{slots[-1]}, ref {node.ref_count}"
        color = COLORS[3] if node.ref_count else COLORS[0]
        ax.text(
            x,
            y + 0.45,
            text,
            va="center",
            fontsize=9,
            color="white",
            bbox=dict(boxstyle="round", facecolor=color, edgecolor="none"),
        )
        parent = where.get(id(node.parent), (0.2, 0.75))
        ax.plot(
            [parent[0], parent[0], x - 0.1],
            [parent[1], y + 0.45, y + 0.45],
            color="#666666",
            linewidth=1,
        )
        where[id(node)] = (x + 0.3, y + 0.85)
    ax.set_xlim(0, 12)
    ax.set_ylim(max(len(rows), 3) + 0.6, 0)
    ax.axis("off")
    ax.set_title(title, loc="left", fontsize=11)


@figure("ch08", "radix_split")
def radix_split() -> plt.Figure:
    """The ch08 main's tree, rebuilt with RadixPrefixCache: one sentence, then the match that
    splits its edge, then the second sentence inserted below the split."""
    import copy

    import torch
    from transformers import AutoTokenizer

    from minisgl.kvcache.radix_cache import RadixPrefixCache

    with tempfile.TemporaryDirectory() as tmp:
        tok = AutoTokenizer.from_pretrained(tiny_model("llama3", tmp))
    cache = RadixPrefixCache(page_size=1)
    fox = tok.encode("The quick brown fox jumps over the lazy dog.")
    cat = tok.encode("The quick brown cat sleeps.")
    cache.insert_prefix(fox, torch.arange(len(fox), dtype=torch.int32))
    states = [
        (
            "1. insert 'The quick brown fox jumps\nover the lazy dog.': one edge",
            copy.deepcopy(cache),
        )
    ]
    hit = cache.match_prefix(cat)
    states.append(
        (
            f"2. match 'The quick brown cat sleeps.':\n{hit.cached_len} tokens hit, "
            "the edge splits there",
            copy.deepcopy(cache),
        )
    )
    cache.insert_prefix(cat, torch.arange(len(fox), len(fox) + len(cat), dtype=torch.int32))
    states.append(("3. insert it: the tokens not cached yet\nbecome a second child", cache))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), layout="constrained")
    fig.suptitle("The radix tree before and after a split (page size 1; ref: the locks held)")
    for ax, (title, state) in zip(axes, states):
        draw_tree(ax, state, tok.decode, title)
    return fig
