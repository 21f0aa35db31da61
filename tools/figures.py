"""The chapters' figures, drawn from what minisgl's own code computes.

    python tools/figures.py [chNN ...] [--png DIR]   # every chapter's figures by default

Each figure function runs minisgl, as it stands in ``python/``, on small inputs or on a tiny
random-weight model from ``examples/tiny_models.py`` (mostly the scenario of the chapter's main),
and draws what the code produced with matplotlib: no number in a figure is typed in by hand. It
writes ``chapters/<id>_<slug>/figures/<name>.svg``, which the chapter's text shows with an
ordinary image link. The SVGs are byte-for-byte reproducible (a fixed hash salt, no date, text
kept as text in DejaVu Sans), so running the command again changes a file only when the code's
results change. ``--png DIR`` also writes a PNG of each figure into DIR, to look at.

The figure functions live in ``tools/figurelib/``, one module a chapter (``ch05.py`` holds
chapter 5's), with what several chapters share in ``common.py``; importing the package
registers every figure in ``FIGURES``. This file is the command: it draws each chapter in a
fresh process on that chapter's tree (``--tree``, internal), with ``figurelib.draw_in_tree``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from figurelib import FIGURES, ROOT, draw_in_tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="chapter ids, e.g. ch05 (default: all)")
    parser.add_argument("--png", type=Path, help="also write a PNG of each figure here")
    parser.add_argument("--tree", type=Path, help=argparse.SUPPRESS)  # one chapter, in its tree
    args = parser.parse_args()
    unknown = sorted(set(args.chapters) - set(FIGURES))
    if unknown:
        parser.error(f"no figures for {', '.join(unknown)}; known: {', '.join(FIGURES)}")
    png = args.png.resolve() if args.png else None
    if args.tree:
        for path in draw_in_tree(args.chapters[0], args.tree, png):
            print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)")
        return
    sys.path.insert(0, str(ROOT / "tools"))
    from stepslib.book import load_book
    from stepslib.tree import tree_at, write_tree

    book = load_book(ROOT)
    for chapter in args.chapters or list(FIGURES):
        # a fresh process on the chapter's tree: the figure shows the code the text shows
        with tempfile.TemporaryDirectory() as tmp:
            write_tree(tree_at(book, book.chapter(int(chapter[2:]))), Path(tmp))
            command = [sys.executable, __file__, chapter, "--tree", tmp]
            command += ["--png", str(png)] if png else []
            env = {**os.environ, "PYTHONHASHSEED": "0"}
            if subprocess.run(command, env=env).returncode != 0:
                sys.exit(f"the figures of {chapter} failed on its tree (above)")


if __name__ == "__main__":
    main()
