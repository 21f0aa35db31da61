"""The chapters' figures: every one a text links exists, every one drawn is linked, and
`render` takes them along with the pages (tools/figures.py draws them)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from bookmaker import steps, write_files

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!\[[^\]]*\]\((figures/[^)\s]+)\)")  # a markdown image in a chapter's text
CHAPTERS = sorted(p for p in (ROOT / "chapters").iterdir() if (p / "README.md").is_file())


def linked(chapter: Path) -> set[str]:
    return set(LINK.findall((chapter / "README.md").read_text(encoding="utf-8")))


def drawn(chapter: Path) -> set[str]:
    folder = chapter / "figures"
    return {f"figures/{p.name}" for p in folder.iterdir()} if folder.is_dir() else set()


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_every_linked_figure_exists_and_every_figure_is_linked(chapter):
    assert linked(chapter) - drawn(chapter) == set(), "linked, but no such file"
    assert drawn(chapter) - linked(chapter) == set(), "a figure no text shows"


def test_every_figure_file_is_one_that_figures_py_draws():
    sys.path.insert(0, str(ROOT / "tools"))
    import figures

    registered = {
        f"{chapter}/figures/{name}.svg"
        for chapter, entries in figures.FIGURES.items()
        for name, _ in entries
    }
    files = {f"{c.name[:4]}/{f}" for c in CHAPTERS for f in drawn(c)}
    assert files == registered


# Draws every figure that reads recorded results only, in a fresh process as figures.py does (the
# same hash seed), and prints those whose file differs from the drawing.
REDRAW = """
import sys
sys.path.insert(0, "tools")
from figurelib import FIGURES, ROOT
from figurelib.common import RECORDED, svg_bytes
print(len(RECORDED))
for chapter, name in sorted(RECORDED):
    draw = dict(FIGURES[chapter])[name]
    folder = next(p for p in (ROOT / "chapters").iterdir() if p.name.startswith(chapter + "_"))
    if (folder / "figures" / f"{name}.svg").read_bytes() != svg_bytes(draw()):
        print(f"{folder.name}/figures/{name}.svg")
"""


def test_every_figure_drawn_from_records_is_drawn_from_the_records_as_they_are():
    """A record in benchmark/results can change with no code changing: each figure drawn from
    records alone must still be what `python tools/figures.py chNN` draws from them now."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [sys.executable, "-c", REDRAW], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    count, *stale = done.stdout.split()
    assert int(count) > 0, "no figure is marked recorded=True"
    assert stale == [], "stale against its record; redraw with python tools/figures.py chNN"


def test_render_copies_the_figures_beside_the_page_and_points_the_links_there(book, tmp_path):
    text = (book / "chapters/ch01_greet/README.md").read_text()
    write_files(
        book,
        {
            "chapters/ch01_greet/figures/flow.svg": "<svg/>",
            "chapters/ch01_greet/README.md": text + "\n![The flow](figures/flow.svg)\n",
        },
    )
    out = tmp_path / "pages"
    done = steps(book, "render", "--out", str(out))
    assert done.returncode == 0, done.stderr
    page = (out / "ch01_greet.md").read_text()
    assert "![The flow](ch01_greet/figures/flow.svg)" in page
    assert (out / "ch01_greet/figures/flow.svg").read_text() == "<svg/>"
    assert not (out / "ch02_shout").exists()  # a chapter without figures gets no folder
