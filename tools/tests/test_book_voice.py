"""The book speaks of itself, never of how it was made.

Every text a reader meets is searched: the chapters, the repository's README, the benchmarks'
README, the exercises' statements, the website's home page and the stage and chapter titles its
navigation shows; and each chapter again with its directives expanded, for the code and tests
it shows. None may speak of the issues the book was planned in, of who wrote or reviewed it, of
"the page" it was modelled on, or of "the project's" machine: a reader has none of these. A
measurement names its machine, its command and its date instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from stepslib.book import load_book
from stepslib.render import render_chapter

ROOT = Path(__file__).resolve().parents[2]

# What a kind of word looks like when it speaks of the book's making (matched case-insensitively).
MAKING: dict[str, str] = {
    "an issue": r"\bissues?\b",
    "a coordinator": r"\bcoordinators?\b",
    "a seed page": r"\bseed\s+(?:page|file|text)s?\b|\bseeds/",
    "a session": r"\bsessions?\b",
    "a review": r"\breview(?:s|ed|ers?|ing)?\b",
    "a helper": r"\bhelpers?\b(?!\.py)",  # tests/helpers.py is a file of the book
    # "the page" as the text a chapter follows. The KV cache's pages are another matter: the page
    # table, the page size, the page allocator, the page of positions 48..51, the page and ...
    "the page": r"\bthe\s+page\b"
    r"(?!-table|\s+(?:tables?|table's|sizes?|allocator|boundary|of|and)\b)",
    "a chapter's page": r"\bchapter[- ]?\d+\s+page\b",
    "the project's machine": r"\b(?:the|this)\s+project's\b|\bVM\b",
    "the code as it once was": r"\bonce\s+held\b|\bfirst\s+kept\b",
}
PATTERNS = {name: re.compile(pattern, re.IGNORECASE) for name, pattern in MAKING.items()}


@dataclass(frozen=True)
class Allowed:
    """A phrase in one text that uses one of the words above in its ordinary sense."""

    path: str
    phrase: str  # a regular expression that covers the hit
    why: str


ALLOWED = [
    Allowed(
        "README.md",
        r'"Report an\s+issue"',
        "the website's link by which a reader reports a problem in the book's repository",
    ),
    Allowed(
        "chapters/ch18_overlap/README.md",
        r"Its issues and pull requests on overlap",
        "upstream's GitHub issues, cited for the bugs they record",
    ),
    Allowed(
        "chapters/ch22_fused/README.md",
        r"https://github\.com/cosmoliu2002/nano-vllm-triton/issues/1",
        "the address of the peers' published figures, a report on another project's tracker",
    ),
    Allowed(
        "chapters/ch14_shell/README.md",
        r"\bsessions?\b",
        "a session of the interactive shell (prompt_toolkit's PromptSession), the chapter's "
        "subject",
    ),
]


def texts() -> dict[str, str]:
    """Every text a reader meets, by its path (steps.yaml's titles under one name)."""
    book = yaml.safe_load((ROOT / "steps.yaml").read_text())
    chapters = [c for stage in book["stages"] for c in stage["chapters"]]
    paths = [f"chapters/{c['id']}_{c['slug']}/README.md" for c in chapters]
    paths += ["README.md", "benchmark/README.md", "tools/site_assets/home.md"]
    paths += sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("practice/*/README.md"))
    found = {path: (ROOT / path).read_text() for path in paths}
    titles = [stage["title"] for stage in book["stages"]] + [c["title"] for c in chapters]
    titles += [
        m.group(1)
        for p in sorted(ROOT.glob("practice/*/exercise.toml"))
        for m in [re.search(r'^title = "(.*)"$', p.read_text(), re.MULTILINE)]
        if m
    ]
    found["the site's titles (stages, chapters, exercises)"] = "\n".join(titles)
    return found


def hits(text: str, allowed: list[Allowed] = ()) -> list[str]:
    """Each word of the book's making in text, with its line, that no allowed phrase covers."""
    covered = [m.span() for a in allowed for m in re.finditer(a.phrase, text, re.IGNORECASE)]
    found = []
    for name, pattern in PATTERNS.items():
        for m in pattern.finditer(text):
            if any(start <= m.start() and m.end() <= end for start, end in covered):
                continue
            found.append((m.start(), name, m.group(0)))
    return [
        f"line {text.count(chr(10), 0, at) + 1}, {name}: {word!r}"
        for at, name, word in sorted(found)
    ]


def unnamed_stages(text: str, count: int) -> list[int]:
    """The stages 1..count that a text never names as 'stage N'."""
    return [
        n for n in range(1, count + 1) if not re.search(rf"\bstage\s+{n}\b", text, re.IGNORECASE)
    ]


def rendered_chapters() -> dict[str, str]:
    """Each chapter's text with its directives expanded, by the path of its README: the code,
    tests and prints the reader sees beside the prose."""
    book = load_book(ROOT)
    return {f"{c.folder}/README.md": render_chapter(book, c) for c in book.chapters}


TEXTS = texts()


@pytest.mark.parametrize("path", sorted(TEXTS))
def test_no_text_speaks_of_the_book_s_making(path: str):
    allowed = [a for a in ALLOWED if a.path == path]
    found = hits(TEXTS[path], allowed)
    assert not found, f"{path} speaks of the book's making:\n" + "\n".join(found)


# Code the chapters show whose comments still speak of the making; each mark goes with its fix
# (a strict xfail: the test fails once the text is clean, so that the mark is removed).
SHOWN_CODE_TO_FIX: dict[str, str] = {}  # chapter -> why its shown code still fails


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return rendered_chapters()


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(path, marks=pytest.mark.xfail(strict=True, reason=SHOWN_CODE_TO_FIX[path]))
        if path in SHOWN_CODE_TO_FIX
        else path
        for path in sorted(p for p in TEXTS if p.startswith("chapters/"))
    ],
)
def test_no_code_a_chapter_shows_speaks_of_the_making(path: str, rendered: dict[str, str]):
    allowed = [a for a in ALLOWED if a.path == path]
    found = hits(rendered[path], allowed)
    assert not found, f"{path}, directives expanded:\n" + "\n".join(found)


@pytest.mark.parametrize("path", ["README.md", "tools/site_assets/home.md"])
def test_the_introductions_name_every_stage(path: str):
    book = yaml.safe_load((ROOT / "steps.yaml").read_text())
    assert unnamed_stages(TEXTS[path], len(book["stages"])) == []


@pytest.mark.parametrize("allowed", ALLOWED, ids=lambda a: a.path)
def test_every_exception_is_still_needed(allowed: Allowed):
    """An exception whose phrase is gone, or that covers no hit, would only hide a later one."""
    text = TEXTS[allowed.path]
    assert re.search(allowed.phrase, text, re.IGNORECASE), allowed.phrase
    assert len(hits(text)) > len(hits(text, [allowed])), allowed.phrase


# The phrases that were found in the book's texts, each of which must be caught.
MAKING_PHRASES = [
    "with the names the issue fixes",
    "Issue 9 asked for 70% or more",
    "Against issue 13's aims",
    "Measured by the book's coordinator on 2026-12-01",
    "is padding (the page's exercise 1)",
    "1 failed (the page's test; the load reads",
    "Stage 5 · Beyond the page",
    "The text is the chapter-20 page's, section by section",
    "there is no seed page for this chapter",
    "Against the aims of\nthe chapter's issue:",
    "on the project's 2-core VM (CPU, one thread)",
    "On a GPU a default pool once held 175 million pages",
    "beside it the Python list that chapter 7 first kept",
    "the page names them without showing them",
    "the reviewers asked for a figure",
    "in the last session",
    "a helper wrote this section",
    "as the seed page shows",
]

ORDINARY_PHRASES = [
    "the page table has one row per request",
    "the page\ntable's width is rounded up",
    "with the page size of 16",
    "a page of the pool",
    "the page-table rows",
    "the page of positions 48..51",
    "the layer, the page and the offset",
    "the page allocator",
    "pages of 16 tokens",
    "random.seed(0) and a seeded draw",
    "the same seed gives the same tokens",
    "shared by all: tests/helpers.py",
    "tissues",
]


@pytest.mark.parametrize("phrase", MAKING_PHRASES)
def test_a_phrase_of_the_making_is_caught(phrase: str):
    assert hits(phrase) != []


@pytest.mark.parametrize("phrase", ORDINARY_PHRASES)
def test_an_ordinary_phrase_passes(phrase: str):
    assert hits(phrase) == []


def test_a_text_that_leaves_out_a_stage_is_caught():
    four = "a decoder (stage 1), a cache (stage 2), a server (stage 3), a GPU (stage 4)"
    assert unnamed_stages(four, 5) == [5]
    assert unnamed_stages(four + ", faster than production (Stage 5)", 5) == []
