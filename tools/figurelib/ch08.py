"""Chapter 8's figure: radix_evict.svg, locks and LRU eviction in the main's tree: a lock's
references up the path, the order of the eviction heap, and a parent that becomes a leaf when its
last child goes (``draw_tree`` draws one state of the tree, ``heap_order`` lists the candidates).
"""

from __future__ import annotations

import copy
import tempfile
from typing import Callable

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from .common import COLORS, GREY, LIGHT, figure, tiny_model

LOCKED, UNLOCKED = COLORS[1], COLORS[0]


def nodes(cache) -> list:
    """Every node but the root, parents before their children, children in their tree order."""
    out: list = []

    def walk(node) -> None:
        for child in node.children.values():
            out.append(child)
            walk(child)

    walk(cache.root)
    return out


def heap_order(cache) -> list:
    """The eviction candidates as ``evict`` takes them: the unlocked leaves, ordered by the
    nodes' own ``__lt__`` (last access, then creation)."""
    return sorted(n for n in nodes(cache) if n.is_leaf() and n.ref_count == 0)


def draw_tree(
    ax: Axes,
    cache,
    decode: Callable[[list[int]], str],
    title: str,
    gone: dict[int, str],
    heap_title: str,
    heap: list,
) -> None:
    """One state of the tree, top to bottom, a box a node (its tokens, slots, references and
    last access); nodes whose creation number is in ``gone`` are drawn faded with that label.
    Below the tree, ``heap``: eviction candidates, next out first."""
    where: dict[int, tuple[float, float]] = {}
    rows = nodes(cache)
    ax.text(0, 0.5, "root (ref 1: never evicted)", va="center", fontweight="bold", fontsize=9)
    for row, node in enumerate(rows, 1):
        depth, parent = 0, node.parent
        while parent.parent is not None:
            depth, parent = depth + 1, parent.parent
        x, y = 0.5 + depth * 1.2, row * 1.15
        slots = node.value.tolist()
        text = (
            f"{decode(node.key)!r}\nslots {slots[0]}–{slots[-1]} · ref {node.ref_count}"
            f" · last access {node.last_access}"
        )
        faded = node.order in gone
        fill = LIGHT if faded else (LOCKED if node.ref_count else UNLOCKED)
        ax.text(
            x,
            y,
            text,
            va="center",
            fontsize=9,
            color=GREY if faded else "white",
            bbox=dict(
                boxstyle="round",
                facecolor=fill,
                edgecolor=GREY if faded else "none",
                linestyle="--",
            ),
        )
        if faded:
            ax.text(6.3, y, gone[node.order], va="center", fontsize=9, color="#444444")
        px, py = where.get(id(node.parent), (0.15, 0.8))
        ax.plot([px, px, x - 0.1], [py, y, y], color="#666666", linewidth=1)
        where[id(node)] = (x + 0.3, y + 0.45)
    top = max(len(rows), 1) * 1.15 + 1.1
    ax.text(0, top, heap_title, fontsize=9, fontweight="bold", va="top")
    lines = [
        f"{i}. {decode(n.key)!r}  (last access {n.last_access})" for i, n in enumerate(heap, 1)
    ]
    ax.text(0.3, top + 0.6, "\n".join(lines) or "(empty)", fontsize=9, va="top", linespacing=1.5)
    ax.set_xlim(0, 10)
    ax.set_ylim(6.9, 0)
    ax.axis("off")
    ax.set_title(title, loc="left", fontsize=11)


@figure("ch08", "radix_evict")
def radix_evict() -> plt.Figure:
    """The ch08 main's cache, rebuilt with RadixPrefixCache: the fox path locked, two evictions
    that take the unlocked leaves oldest first, then the path unlocked and evicted from its leaf
    back, its parent a leaf in turn."""
    import torch
    from transformers import AutoTokenizer

    from minisgl.kvcache.radix_cache import RadixPrefixCache

    with tempfile.TemporaryDirectory() as tmp:
        tok = AutoTokenizer.from_pretrained(tiny_model("llama3", tmp))
    cache = RadixPrefixCache(page_size=1)
    fox = tok.encode("The quick brown fox jumps over the lazy dog.")
    cat = tok.encode("The quick brown cat sleeps.")
    once = tok.encode("Once upon a time")
    held = cache.insert_prefix(fox, torch.arange(len(fox))).handle  # slots numbered as the main
    cache.match_prefix(cat)  # the match that splits the fox edge
    start = len(fox)
    for ids in (cat, once):
        cache.insert_prefix(ids, torch.arange(start, start + len(ids)))
        start += len(ids)

    def evict_in_order(times: int) -> dict[int, str]:
        """evict(1) ``times`` times; the creation numbers of the nodes that went, labelled,
        each checked against the heap order drawn."""
        gone: dict[int, str] = {}
        for k in range(times):
            expected = heap_order(cache)[0].order
            before = {n.order for n in nodes(cache)}
            slots = cache.evict(1).tolist()
            (order,) = before - {n.order for n in nodes(cache)}  # one whole leaf a call here
            assert order == expected, "the heap drawn is not the order evict took"
            gone[order] = f"evict(1) #{k + 1}: {len(slots)} slots go"
        return gone

    cache.lock_handle(held)
    locked, heap_locked = copy.deepcopy(cache), heap_order(cache)
    gone_first = evict_in_order(2)
    heap_after_first = heap_order(cache)
    cache.lock_handle(held, unlock=True)
    unlocked = copy.deepcopy(cache)
    gone_fox = {k: v + ";\nits parent is now a leaf" for k, v in evict_in_order(1).items()}

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), layout="constrained")
    fig.suptitle(
        "Locks and LRU eviction in the main's tree (orange: locked, ref > 0; blue: evictable)"
    )
    panels = [
        (
            locked,
            "1. lock the fox path: ref +1 on its node\nand on every node up to the root",
            {},
            "eviction heap, next out first (locked nodes never enter):",
            heap_locked,
        ),
        (
            locked,
            "2. evict(1) twice: whole leaves,\nthe least recently used first",
            gone_first,
            "heap after both (the rest is locked):",
            heap_after_first,
        ),
        (
            unlocked,
            "3. unlock it, evict(1): the leaf goes,\nand its parent joins the heap",
            gone_fox,
            "heap after:",
            heap_order(cache),
        ),
    ]
    for ax, (state, title, gone, heap_title, heap) in zip(axes, panels):
        draw_tree(ax, state, tok.decode, title, gone, heap_title, heap)
    return fig
