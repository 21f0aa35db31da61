"""Chapter 20 is its page: every sentence of the page (`data/ch20_page.txt`, the page as a
reader sees it) is in the rendered chapter, word for word. The book may add around the page's
text, never change it."""

import re

from bookmaker import REPO, steps

PAGE = (REPO / "tools/tests/data/ch20_page.txt").read_text(encoding="utf-8")
# Lines of the page that are the website's frame, or a test's Chinese message the book gives in
# English, not the chapter's text.
NOT_TEXT = (
    "mini-sglang from Scratch Stage 4 · Faster and bigger",
    '@pytest.mark.skipif(importlib.util.find_spec("triton") is None',
    "Exercises for this chapter (1)",
    "Write the code and run the tests in your browser",
    "The exercises are in Chinese for now.",
    "203. moe_align_block_size 与分组 GEMM (hard)",
    "Found a mistake or a better way to say it?",
    "Edit this page on GitHub · Report an issue",
)


def _plain(text: str) -> str:
    """Markdown's marks, list bullets and line breaks gone: the words a reader sees."""
    text = re.sub(r"\]\([^)]*\)", "]", text)  # a link's address
    text = re.sub(r"[`*\\\[\]]", "", text)
    text = re.sub(r"^\s*(?:[-•>]|\d+\.)\s+", " ", text, flags=re.M)
    return re.sub(r"\s+", " ", text).strip()


def _sentences(page: str) -> list[str]:
    found = []
    for line in page.splitlines():
        line = line.strip().lstrip("•").strip()
        if line.startswith(NOT_TEXT):
            continue
        found += [s for s in re.split(r"(?<=[.:?])\s+", line) if len(_plain(s)) > 25]
    return found


def test_every_sentence_of_the_page_is_in_chapter_20(tmp_path):
    done = steps(REPO, "render", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    chapter = _plain((tmp_path / "ch20_moe.md").read_text(encoding="utf-8"))
    missing = [s for s in _sentences(PAGE) if _plain(s) not in chapter]
    assert not missing, "chapter 20 changed the page's words:\n" + "\n".join(missing)
    assert len(_sentences(PAGE)) > 150  # the whole page, code and prose
