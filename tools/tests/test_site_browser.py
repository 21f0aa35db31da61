"""The website in a real browser: build it with the documented command, serve build/site on
127.0.0.1 and drive the distribution's headless Chromium through Playwright to check that a
chapter page shows its tree listing, a code listing and its figures, and that its exercise's
starter fails and its reference passes in the browser, line for line as `practice/judge.py`
judges them locally. Screenshots go to build/screenshots/ (CI keeps them).

The chapter is the latest one with a browser exercise, or SITE_TEST_CHAPTER (e.g. ch17) and
SITE_TEST_EXERCISE (e.g. 171). Without Chromium, Playwright, mkdocs or `npm ci`'s Pyodide the
test is skipped, except under CI (CI=true), where it fails.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "build" / "site"
SHOTS = REPO / "build" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
PYODIDE_MS = 180_000  # the first run loads Python into the page's worker

sys.path.insert(0, str(REPO / "tools"))
from stepslib.book import load_book  # noqa: E402
from stepslib.render import directives, expand  # noqa: E402
from stepslib.tree import listing  # noqa: E402


def _missing() -> list[str]:
    missing = [] if CHROMIUM.is_file() else ["chromium (apt-get install chromium)"]
    for module, how in (("playwright", "pip install -e '.[site]'"),
                        ("mkdocs", "pip install -e '.[site]'")):
        if importlib.util.find_spec(module) is None:
            missing.append(f"{module} ({how})")
    if not (REPO / "node_modules" / "pyodide" / "pyodide.mjs").is_file():
        missing.append("pyodide (npm ci)")
    return missing


@pytest.fixture(scope="module", autouse=True)
def _tools() -> None:
    missing = _missing()
    if missing and os.environ.get("CI"):
        pytest.fail(f"the site test needs {', '.join(missing)}")
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")


def _judge():
    spec = importlib.util.spec_from_file_location("site_test_judge", REPO / "practice/judge.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


judge = _judge()


def _chosen() -> tuple:
    """(chapter, exercise): from the environment, or the latest chapter's browser exercise."""
    book = load_book(REPO)
    exercises = [e for e in judge.exercises() if e.runs == "browser"]
    wanted = os.environ.get("SITE_TEST_EXERCISE")
    if wanted:
        exercise = judge.find(wanted)
    else:
        chapter_id = os.environ.get("SITE_TEST_CHAPTER")
        numbers = [int(chapter_id.removeprefix("ch"))] if chapter_id else \
            [c.number for c in book.chapters]
        exercise = max((e for e in exercises if e.chapter in numbers),
                       key=lambda e: (e.chapter, -int(e.id)))
    return book, book.chapter(exercise.chapter), exercise


BOOK, CHAPTER, EXERCISE = _chosen()


@pytest.fixture(scope="module")
def url() -> str:
    """The site, built by the documented command and served on a free port of 127.0.0.1."""
    done = subprocess.run([sys.executable, str(REPO / "tools" / "site.py"), "build"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    handler = functools.partial(_Quiet, directory=str(SITE))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    thread.join()


class _Quiet(SimpleHTTPRequestHandler):
    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript",
                      ".wasm": "application/wasm"}

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def page(url: str):
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="chromium-") as profile, \
            sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=str(CHROMIUM), headless=True, args=FLAGS,
            viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.errors = []
        page.on("pageerror", lambda error: page.errors.append(str(error)))
        page.goto(url + f"{CHAPTER.name}.html", wait_until="load")
        yield page
        context.close()


def _code_texts(page) -> list[str]:
    return [t.strip() for t in page.locator("article pre code").all_inner_texts()]


def test_the_page_shows_the_tree_listing(page) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)  # the screenshots are for a person to look at
    page.screenshot(path=str(SHOTS / f"site_{CHAPTER.id}_top.png"))
    texts = _code_texts(page)
    assert listing(BOOK, CHAPTER).strip() in texts
    tree = page.locator("article pre").nth(texts.index(listing(BOOK, CHAPTER).strip()))
    tree.screenshot(path=str(SHOTS / f"site_{CHAPTER.id}_tree.png"))


def test_the_page_shows_a_code_listing_from_the_source(page) -> None:
    text = (BOOK.root / CHAPTER.folder / "README.md").read_text(encoding="utf-8")
    argument = next(arg for _, kind, arg in directives(text) if kind == "code")
    markdown = expand(BOOK, CHAPTER, "code", argument)
    code = re.search(r"```python\n(.*)\n```", markdown, re.S).group(1)
    assert code.strip() in _code_texts(page), f"no listing of {argument}"


def test_the_figures_render(page) -> None:
    text = (BOOK.root / CHAPTER.folder / "README.md").read_text(encoding="utf-8")
    expected = len(re.findall(r"\]\(figures/", text))
    images = page.locator("article img[src*='/figures/']")
    assert expected >= 1 and images.count() == expected
    for i in range(expected):
        images.nth(i).scroll_into_view_if_needed()
        width = images.nth(i).evaluate("img => img.complete ? img.naturalWidth : 0")
        assert width > 0, f"figure {images.nth(i).get_attribute('src')} did not load"
    images.first.screenshot(path=str(SHOTS / f"site_{CHAPTER.id}_figure.png"))


def test_the_page_ends_with_its_exercises_and_links(page) -> None:
    count = sum(e.chapter == CHAPTER.number for e in judge.exercises())
    headings = page.locator("article h2").all_inner_texts()
    assert any(h.startswith(f"Exercises for this chapter ({count})") for h in headings)
    edit = page.get_by_role("link", name="Edit this page on GitHub")
    assert edit.get_attribute("href").endswith(f"/edit/main/{CHAPTER.folder}/README.md")
    assert page.get_by_role("link", name="Report an issue").count() == 1


def _local_report(file: Path) -> list[str]:
    """What `python practice/judge.py ID FILE` prints after its first line."""
    done = subprocess.run([sys.executable, str(REPO / "practice" / "judge.py"), EXERCISE.id,
                           str(file)], capture_output=True, text=True, timeout=300)
    return done.stdout.splitlines()[1:]


def _run_in_browser(page, source: str) -> tuple[str, list[str]]:
    block = page.locator(f".practice[data-exercise='{EXERCISE.id}']")
    block.locator(".practice-editor").fill(source)
    block.locator(".practice-run").click()
    page.wait_for_function(
        f"document.querySelector(\".practice[data-exercise='{EXERCISE.id}']\")"
        ".dataset.verdict.match(/^(pass|fail)$/)", timeout=PYODIDE_MS)
    lines = block.locator(".practice-output").inner_text().strip().splitlines()
    return block.get_attribute("data-verdict"), lines


def test_the_starter_fails_in_the_browser_as_it_does_locally(page) -> None:
    block = page.locator(f".practice[data-exercise='{EXERCISE.id}']")
    starter = EXERCISE.file("starter.py")
    assert block.locator(".practice-editor").input_value() == starter.read_text()
    verdict, lines = _run_in_browser(page, starter.read_text())
    assert verdict == "fail" and lines[-1].startswith("FAILED"), lines
    assert lines == _local_report(starter)
    assert page.errors == []


def test_the_reference_passes_in_the_browser_as_it_does_locally(page) -> None:
    reference = EXERCISE.file("reference.py")
    verdict, lines = _run_in_browser(page, reference.read_text())
    assert verdict == "pass" and lines[-1].startswith("PASSED"), lines
    assert lines == _local_report(reference)
    block = page.locator(f".practice[data-exercise='{EXERCISE.id}']")
    block.scroll_into_view_if_needed()
    block.screenshot(path=str(SHOTS / f"site_{CHAPTER.id}_exercise_{EXERCISE.id}.png"))
    page.screenshot(path=str(SHOTS / f"site_{CHAPTER.id}_exercise_{EXERCISE.id}_page.png"))
    assert page.errors == []
