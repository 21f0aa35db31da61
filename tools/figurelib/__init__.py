"""The chapters' figures, one module a chapter, drawn by ``tools/figures.py``.

Modules:
    common -- the registry (``FIGURES``, ``figure``), the palette, the helpers several chapters
              use (``tiny_model``, ``quietly``, ``run_main``, ``timeline``, the diagram pieces)
              and ``draw_in_tree``, which draws a chapter's figures with the code of its tree
    chNN   -- chapter NN's figure functions and the helpers only it uses (only the chapters
              that have figures have a module)

Importing the package imports every chapter module, so every figure is in ``FIGURES``, in
chapter order. A figure function imports ``minisgl`` inside itself: it runs against the
chapter's tree that ``draw_in_tree`` puts first on ``sys.path``.
"""

from . import common  # first: it picks the matplotlib backend and the style

# isort: split
from . import (  # noqa: F401  (each registers its figures)
    ch01,
    ch02,
    ch03,
    ch04,
    ch05,
    ch06,
    ch07,
    ch08,
    ch09,
    ch10,
    ch11,
    ch12,
    ch13,
    ch14,
    ch15,
    ch16,
    ch17,
    ch18,
    ch19,
    ch20,
    ch21,
    ch22,
    ch23,
    ch24,
    ch25,
)
from .common import FIGURES, ROOT, draw_in_tree

__all__ = ["FIGURES", "ROOT", "common", "draw_in_tree"]
