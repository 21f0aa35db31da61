"""What every chapter's figures share: the registry and the drawing style, and the helpers that
more than one chapter uses.

``FIGURES`` maps a chapter id to its figures, in the order they are drawn; ``figure`` registers
one. ``COLORS``, ``GREY`` and ``LIGHT`` are the palette, ``box``, ``arrow`` and ``diagram`` the
diagrams' pieces. ``tiny_model`` writes a tiny random-weight model, ``quietly`` swallows prints,
``run_main`` runs a chapter's main (``Step`` records what its scheduler did, ``timeline`` draws
those steps). ``TREE`` is the chapter's own tree while its figures are drawn: ``draw_in_tree``
sets it, puts the tree's ``python/`` and ``examples/`` first on ``sys.path`` and draws the
chapter's figures, so that the figure functions' lazy ``minisgl`` imports get the tree's code.
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TREE = ROOT  # the chapter's own tree, written by `steps.py checkout`, while its figures are drawn

plt.rcParams.update(
    {
        "svg.hashsalt": "minisgl-figures",  # fixed ids inside the SVG
        "svg.fonttype": "none",  # text stays text: small files, searchable
        "font.family": "DejaVu Sans",
        "font.size": 11,
        "axes.titlesize": 12,
        "figure.titlesize": 14,
        "figure.titleweight": "bold",
    }
)
# one colour per request / rank / part, in this order
COLORS = [
    "#4C72B0",
    "#DD8452",
    "#55A868",
    "#C44E52",
    "#8172B3",
    "#937860",
    "#DA8BC3",
    "#8C8C8C",
    "#CCB974",
    "#64B5CD",
]
GREY, LIGHT = "#B0B0B0", "#EEEEEE"

FIGURES: dict[str, list[tuple[str, Callable[[], plt.Figure]]]] = {}
# (chapter, name) of the figures drawn from benchmark/results only, with no minisgl: a record can
# change without any chapter's code changing, so tools/tests/test_figures.py redraws these and
# compares them with the files
RECORDED: set[tuple[str, str]] = set()


def figure(chapter: str, name: str, *, recorded: bool = False):
    """Register a function that returns a matplotlib figure as ``chapter``'s ``name``.svg;
    ``recorded``: it reads recorded results only (see ``RECORDED``)."""

    def register(draw: Callable[[], plt.Figure]) -> Callable[[], plt.Figure]:
        FIGURES.setdefault(chapter, []).append((name, draw))
        if recorded:
            RECORDED.add((chapter, name))
        return draw

    return register


def svg_bytes(fig: plt.Figure) -> bytes:
    """The figure as the SVG file figures.py writes: no date, so the same drawing gives the
    same bytes."""
    out = io.BytesIO()
    fig.savefig(out, format="svg", metadata={"Date": None})
    return out.getvalue()


def quietly(fn: Callable, *args, **kwargs):
    """Call fn with its prints and the libraries' log lines swallowed."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return fn(*args, **kwargs)


def tiny_model(family: str, tmp: str) -> str:
    import tiny_models
    from transformers.utils import logging

    logging.set_verbosity_error()
    return str(tiny_models.make_tiny_model(family, f"{tmp}/{family}"))


def box(
    ax: Axes, x: float, y: float, w: float, h: float, fill: str, text: str = "", **text_args
) -> None:
    """A filled rectangle with centred text (y grows downwards in the diagrams)."""
    ax.add_patch(Rectangle((x, y), w, h, facecolor=fill, edgecolor="white", linewidth=1.5))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", **text_args)


def arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], **style) -> None:
    ax.add_patch(
        FancyArrowPatch(
            start,
            end,
            arrowstyle="-|>",
            mutation_scale=14,
            color=style.pop("color", "#444444"),
            linewidth=1.3,
            **style,
        )
    )


def diagram(ax: Axes, width: float, height: float) -> None:
    """Data coordinates (0, 0) top left to (width, height), no axes drawn."""
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")


# ------------------------------------------------------------------------ running a chapter's main
@dataclass
class Step:
    """What one Scheduler.step did, as a chapter's main ran it."""

    phase: str
    ran: dict[int, int]  # uid -> tokens run in this step's batch
    sampled: list[int]  # uids that got a token
    finished: list[int]
    waiting: list[int]  # uids still waiting once the step was done
    pages_used: int  # once the step's finished requests gave their pages back
    budget: int  # the prompt tokens a prefill may run (max_extend_tokens)
    pages_reserved: int  # pages the running requests may still take (DecodeManager's count)


def run_main(main: str, steps: list[list[Step]] | None = None) -> dict:
    """Run examples/<main> as it is, quietly; its globals. With ``steps``, every run of the
    scheduler (from a step to the step that returns None) is recorded there."""
    if steps is None:
        return quietly(runpy.run_path, str(TREE / "examples" / main), run_name="__main__")
    from minisgl.scheduler import Scheduler

    real_add, real_step = Scheduler.add_req, Scheduler.step
    reqs = []

    def add_req(self, *args, **kwargs):
        reqs.append(real_add(self, *args, **kwargs))
        return reqs[-1]

    def step(self):
        before = {r.uid: len(r.output_ids) for r in reqs}
        out = real_step(self)
        if out is None:
            steps.append([])
            return out
        sampled = [r.uid for r in reqs if len(r.output_ids) > before.get(r.uid, 0)]
        used = self.engine.num_pages - self.cache_manager.num_free_pages
        steps[-1].append(
            Step(
                out.phase,
                dict(zip(out.uids, out.extend_lens)),
                sampled,
                [r.uid for r in out.finished],
                [r.uid for r in self.waiting],
                used,
                self.config.max_extend_tokens,
                self.decode_manager.reserved_pages(self.page_size),
            )
        )
        return out

    steps.append([])
    Scheduler.add_req, Scheduler.step = add_req, step
    try:
        return quietly(runpy.run_path, str(TREE / "examples" / main), run_name="__main__")
    finally:
        Scheduler.add_req, Scheduler.step = real_add, real_step


# -------------------------------------------------- a scheduler's steps as a timeline (ch07, ch10)
PHASE_COLORS = {"prefill": COLORS[0], "decode": COLORS[2]}


def timeline(ax: Axes, steps: list[Step]) -> None:
    """Requests down, steps across: P prefill (n tokens run), D decode, * the last token,
    w waiting, . running but not in this step's batch."""
    uids = sorted({u for s in steps for u in [*s.ran, *s.waiting]})
    done: set[int] = set()
    started: set[int] = set()
    for x, step in enumerate(steps):
        for row, uid in enumerate(uids):
            if uid in step.ran:
                letter = "P" if step.phase == "prefill" else "D"
                if step.phase == "prefill" and len({*step.ran, *step.waiting}) > 0:
                    letter = f"P{step.ran[uid]}"
                letter += "*" if uid in step.finished else ""
                box(ax, x, row, 1, 1, PHASE_COLORS[step.phase], letter, color="white", fontsize=9)
                started.add(uid)
            elif uid in step.waiting:
                box(ax, x, row, 1, 1, LIGHT, "w", color="#666666", fontsize=9)
            elif uid in started and uid not in done:
                box(ax, x, row, 1, 1, "#F8F8F8", "·", color="#666666")
        done.update(step.finished)
    ax.set_xlim(0, len(steps))
    ax.set_ylim(len(uids), 0)
    ax.set_xticks([x + 0.5 for x in range(len(steps))], range(len(steps)))
    ax.set_yticks([r + 0.5 for r in range(len(uids))], [f"request {u}" for u in uids])
    ax.tick_params(length=0)
    ax.spines[:].set_visible(False)


# --------------------------------------------------------------------- drawing in a chapter's tree
def draw_in_tree(chapter: str, tree: Path, png: Path | None) -> list[Path]:
    """Draw one chapter's figures with the code of its tree; the files written."""
    global TREE
    TREE = tree
    sys.path[:0] = [str(tree / "python"), str(tree / "examples")]
    import torch

    torch.set_num_threads(1)
    folder = next(p for p in (ROOT / "chapters").iterdir() if p.name.startswith(chapter + "_"))
    written = []
    for name, draw in FIGURES[chapter]:
        fig = quietly(draw)
        out = folder / "figures" / f"{name}.svg"
        out.parent.mkdir(exist_ok=True)
        out.write_bytes(svg_bytes(fig))
        if png is not None:
            png.mkdir(parents=True, exist_ok=True)
            fig.savefig(png / f"{chapter}_{name}.png", dpi=80)
        plt.close(fig)
        written.append(out)
    return written
