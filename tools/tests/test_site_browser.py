"""The website in a real browser: build it with the documented command, serve build/site on
127.0.0.1 and drive the distribution's headless Chromium through Playwright to check that a
chapter page shows its tree listing, a code listing and its figures (where it draws none, the
latest chapter's that draws some), and that its exercise's starter fails and its reference
passes in the browser, line for line as `practice/judge.py` judges them locally; that the editor
keeps the learner's code across a reload; and, on every page, that it reads well offline: no
request leaves 127.0.0.1, no console error, no code block scrolls sideways at 1280 or 1920 px,
every figure's smallest text is at least 9 px once enlarged, the two kinds of exercises have
headings of their own, chapters link to the previous and the next, a chapter's h1 and window
title are numbered as the navigation numbers it, and the home page numbers the chapters through
the stages. On a phone (390 x 844): nothing scrolls the page sideways, code and prints keep
their lines and scroll in their box, a wide table or listing shades the side where more is
hidden, figures fit the page, and a figure opens fitted to the screen, zooms and closes (its
button, Escape, a tap beside it). Screenshots go to build/screenshots/ (CI keeps them).

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
from urllib.parse import urlsplit

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "build" / "site"
SHOTS = REPO / "build" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PYODIDE_MS = 180_000  # the first run loads Python into the page's worker
READABLE_PX = 9  # the smallest figure text, as shown
WIDTHS = (1280, 1920)  # common screens: the code must fit the text column on both
FONT_SIZE = re.compile(r"font-size:\s*([\d.]+)px")
VIEWBOX = re.compile(r'<svg[^>]*\bviewBox="[\d.]+ [\d.]+ ([\d.]+) [\d.]+"')

sys.path.insert(0, str(REPO / "tools"))
from stepslib.book import load_book  # noqa: E402
from stepslib.render import directives, expand  # noqa: E402
from stepslib.tree import listing  # noqa: E402


def _missing() -> list[str]:
    missing = [] if CHROMIUM.is_file() else ["chromium (apt-get install chromium)"]
    for module, how in (
        ("playwright", "pip install -e '.[site]'"),
        ("mkdocs", "pip install -e '.[site]'"),
    ):
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
        numbers = (
            [int(chapter_id.removeprefix("ch"))]
            if chapter_id
            else [c.number for c in book.chapters]
        )
        exercise = max(
            (e for e in exercises if e.chapter in numbers), key=lambda e: (e.chapter, -int(e.id))
        )
    return book, book.chapter(exercise.chapter), exercise


BOOK, CHAPTER, EXERCISE = _chosen()


@pytest.fixture(scope="module")
def url() -> str:
    """The site, built by the documented command and served on a free port of 127.0.0.1."""
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "site.py"), "build"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    handler = functools.partial(_Quiet, directory=str(SITE))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    thread.join()


class _Quiet(SimpleHTTPRequestHandler):
    extensions_map = {
        **SimpleHTTPRequestHandler.extensions_map,
        ".mjs": "text/javascript",
        ".wasm": "application/wasm",
    }

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def context(url: str):
    """One browser for the module. Every request is routed: one that leaves 127.0.0.1 is
    recorded in `context.outside` and refused; console errors go to `context.console`."""
    from playwright.sync_api import sync_playwright

    def route(route) -> None:
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            context.outside.append(route.request.url)
            route.abort()

    with (
        tempfile.TemporaryDirectory(prefix="chromium-") as profile,
        sync_playwright() as playwright,
    ):
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=FLAGS,
            viewport={"width": WIDTHS[0], "height": 900},
        )
        context.outside, context.console = [], []
        context.route("**/*", route)
        context.on(
            "console",
            lambda message: (
                context.console.append(message.text) if message.type == "error" else None
            ),
        )
        yield context
        context.close()


@pytest.fixture(scope="module")
def page(context, url: str):
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    page.goto(url + f"{CHAPTER.name}.html", wait_until="load")
    yield page
    page.close()


@pytest.fixture
def tab(context, url: str):
    """A page of its own, for a test that visits other pages; visit(name) loads one."""
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda error: page.errors.append(str(error)))

    def visit(name: str):
        page.set_viewport_size({"width": WIDTHS[0], "height": 900})
        page.goto(url + name, wait_until="load")
        return page

    page.visit = visit
    yield page
    page.close()


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


def _figures(chapter) -> int:
    text = (BOOK.root / chapter.folder / "README.md").read_text(encoding="utf-8")
    return len(re.findall(r"\]\(figures/", text))


# the chapter whose figures are checked: the chosen one, or where it draws none (chapter 25),
# the latest that draws some
FIGURED = next(c for c in [CHAPTER, *reversed(BOOK.chapters)] if _figures(c))


def test_the_figures_render(page, tab) -> None:
    if FIGURED != CHAPTER:
        page = tab.visit(f"{FIGURED.name}.html")
    expected = _figures(FIGURED)
    images = page.locator("article img[src*='/figures/']")
    assert expected >= 1 and images.count() == expected
    for i in range(expected):
        images.nth(i).scroll_into_view_if_needed()
        width = images.nth(i).evaluate("img => img.complete ? img.naturalWidth : 0")
        assert width > 0, f"figure {images.nth(i).get_attribute('src')} did not load"
    images.first.screenshot(path=str(SHOTS / f"site_{FIGURED.id}_figure.png"))


def test_the_page_ends_with_its_exercises_and_links(page) -> None:
    count = sum(e.chapter == CHAPTER.number for e in judge.exercises())
    assert _headings(page)[-1] == f"Judged exercises ({count})"
    edit = page.get_by_role("link", name="Edit this page on GitHub")
    issue = page.get_by_role("link", name="Report an issue")
    if not yaml.safe_load((REPO / "steps.yaml").read_text())["published"]:  # a 404 until then
        assert edit.count() == 0 and issue.count() == 0
        return
    assert edit.get_attribute("href").endswith(f"/edit/main/{CHAPTER.folder}/README.md")
    assert issue.count() == 1


def _local_report(file: Path) -> list[str]:
    """What `python practice/judge.py ID FILE` prints after its first line."""
    done = subprocess.run(
        [sys.executable, str(REPO / "practice" / "judge.py"), EXERCISE.id, str(file)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.stdout.splitlines()[1:]


def _run_in_browser(page, source: str) -> tuple[str, list[str]]:
    block = page.locator(f".practice[data-exercise='{EXERCISE.id}']")
    block.locator(".practice-editor").fill(source)
    block.locator(".practice-run").click()
    page.wait_for_function(
        f"document.querySelector(\".practice[data-exercise='{EXERCISE.id}']\")"
        ".dataset.verdict.match(/^(pass|fail)$/)",
        timeout=PYODIDE_MS,
    )
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


def test_the_editor_keeps_the_code_across_a_reload_until_reset(page) -> None:
    block = page.locator(f".practice[data-exercise='{EXERCISE.id}']")
    mine = "# my attempt\ndef f():\n    return 1\n"
    block.locator(".practice-editor").fill(mine)
    page.reload(wait_until="load")
    assert block.locator(".practice-editor").input_value() == mine
    block.locator(".practice-reset").click()
    starter = EXERCISE.file("starter.py").read_text()
    assert block.locator(".practice-editor").input_value() == starter
    page.reload(wait_until="load")  # the reset dropped the stored copy too
    assert block.locator(".practice-editor").input_value() == starter
    assert page.errors == []


# --- every page ---------------------------------------------------------------------------------

PAGES = ["index.html", *(f"{c.name}.html" for c in BOOK.chapters), "practice.html"]
CHAPTERS = [c.name for c in BOOK.chapters]


def _headings(page) -> list[str]:
    return [h.replace("¶", "").strip() for h in page.locator("article h2").all_inner_texts()]


@pytest.mark.parametrize("name", PAGES)
def test_the_page_asks_nothing_beyond_the_site(context, tab, name: str) -> None:
    context.outside.clear()
    context.console.clear()
    tab.visit(name).wait_for_load_state("networkidle")
    assert context.outside == [], "requests that left 127.0.0.1"
    assert context.console == [] and tab.errors == []


# Each line of the page's code blocks: its length, its rows as shown, and whether its
# continuation rows start right of the line's first non-space character.
LINES = """() => [...document.querySelectorAll("article pre > code > span[id^='__span-']")]
  .map((line) => {
    const range = document.createRange();
    range.selectNodeContents(line);
    const rects = [...range.getClientRects()].filter((r) => r.width > 0);
    const tops = [...new Set(rects.map((r) => Math.round(r.top)))].sort((a, b) => a - b);
    const walker = document.createTreeWalker(line, NodeFilter.SHOW_TEXT);
    let indent = null;
    for (let node = walker.nextNode(); node && !indent; node = walker.nextNode()) {
      const at = node.data.search(/\\S/);
      if (at >= 0) { range.setStart(node, at); range.setEnd(node, at + 1); indent = range; }
    }
    const left = indent ? indent.getBoundingClientRect().left : 0;
    const kept = rects.filter((r) => Math.round(r.top) !== tops[0])
      .every((r) => r.left > left + 1);
    return {text: line.textContent.replace(/\\n$/, ""), rows: tops.length, kept};
  })"""

LONGEST = """codes => codes.map((c) => Math.max(...c.innerText.split("\\n").map((l) => l.length)))
  .reduce((best, n, i, all) => n > all[best] ? i : best, 0)"""  # the block with the longest line


@pytest.mark.parametrize("name", CHAPTERS)
def test_code_fits_the_column_and_a_longer_line_wraps_keeping_its_indentation(tab, name: str):
    page = tab.visit(f"{name}.html")
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        scrolled = page.eval_on_selector_all(
            "article pre > code",
            "codes => codes.filter(c => c.scrollWidth > c.clientWidth)"
            ".map(c => c.innerText.slice(0, 60))",
        )
        assert scrolled == [], f"at {width} px these blocks scroll sideways"
        lines = page.evaluate(LINES)
        assert lines, "no code on the page"
        split = [line["text"] for line in lines if line["rows"] > 1 and len(line["text"]) <= 100]
        assert split == [], f"at {width} px lines of 100 columns or fewer wrap"
        lost = [line["text"] for line in lines if line["rows"] > 1 and not line["kept"]]
        assert lost == [], f"at {width} px wrapped lines lose their indentation"
        if name in ("ch08_radix", "ch20_moe", CHAPTER.name):  # for a person to look at
            page.screenshot(path=str(SHOTS / f"site_{name}_{width}.png"))
            widest = page.eval_on_selector_all("article pre > code", LONGEST)
            page.locator("article pre > code").nth(widest).screenshot(
                path=str(SHOTS / f"site_{name}_{width}_longest_line.png")
            )


def _smallest_text(svg: str) -> float:
    """The figure's smallest font size, in the units of its viewBox's width."""
    assert "scale(" not in svg, "a scaled text would make font-size the wrong measure"
    return min(float(size) for size in FONT_SIZE.findall(svg))


@pytest.mark.parametrize(
    "name", [c.name for c in BOOK.chapters if (BOOK.root / c.folder / "figures").is_dir()]
)
def test_every_figure_enlarges_to_readable_text(tab, name: str) -> None:
    page = tab.visit(f"{name}.html")
    links = page.locator("article a.figure-zoom")
    figures = page.locator("article img[src*='/figures/']")
    assert links.count() == figures.count() >= 1, "a figure that does not enlarge"
    for i in range(links.count()):
        href = links.nth(i).get_attribute("href")
        svg = (SITE / href).read_text(encoding="utf-8")
        links.nth(i).click()
        enlarged = page.locator("dialog.figure-dialog[open] img")
        enlarged.wait_for()
        page.wait_for_function(
            "img => img.complete && img.naturalWidth > 0", arg=enlarged.element_handle()
        )
        shown = enlarged.evaluate("img => img.getBoundingClientRect().width")
        smallest = _smallest_text(svg) * shown / float(VIEWBOX.search(svg).group(1))
        if name == "ch08_radix" and i == 0:
            page.screenshot(path=str(SHOTS / f"site_{name}_figure_enlarged.png"))
        assert smallest >= READABLE_PX, f"{href}: its smallest text at {smallest:.1f} px"
        page.keyboard.press("Escape")
        page.locator("dialog.figure-dialog[open]").wait_for(state="detached")
    assert tab.errors == []


# --- on a phone ---------------------------------------------------------------------------------

PHONE = {"width": 390, "height": 844}
TABLES = "ch22_fused"  # tables wider than a phone
FIGURE_PAGE = "ch21_fast_moe"  # its first figure is the widest the book draws

# What a phone shows of the page: how wide it is, and for each code block, print and figure
# what overflows it or how it is laid out.
ON_A_PHONE = """() => {
  const style = (e) => getComputedStyle(e);
  const boxes = [...document.querySelectorAll("article pre > code, article pre.practice-output")];
  const lines = [...document.querySelectorAll("article pre > code > span[id^='__span-']")];
  const figures = [...document.querySelectorAll("article img, article svg")];
  return {
    page: document.scrollingElement.scrollWidth,
    width: innerWidth,
    boxes: boxes.map((b) => [style(b).whiteSpace, style(b).overflowX]),
    wrapped: lines.filter((line) => {
      const range = document.createRange();
      range.selectNodeContents(line);
      const tops = [...range.getClientRects()].filter((r) => r.width > 0).map((r) => r.top);
      return new Set(tops.map(Math.round)).size > 1;
    }).map((line) => line.textContent.slice(0, 60)),
    wide: figures.filter((f) => f.getBoundingClientRect().right > innerWidth + 0.5)
      .map((f) => f.getAttribute("src") || f.outerHTML.slice(0, 60)),
  };
}"""


@pytest.mark.parametrize("name", ["index.html", *(f"{c}.html" for c in CHAPTERS), "practice.html"])
def test_on_a_phone_code_and_prints_scroll_in_their_box_and_figures_fit(tab, name: str) -> None:
    page = tab.visit(name)
    page.set_viewport_size(PHONE)
    seen = page.evaluate(ON_A_PHONE)
    assert seen["page"] <= seen["width"], f"the page scrolls sideways ({seen['page']} px)"
    bad = [box for box in seen["boxes"] if box[0] != "pre" or box[1] not in ("auto", "scroll")]
    assert bad == [], "code or prints that wrap, or do not scroll in their box"
    assert seen["wrapped"] == [], "code lines that wrap on a phone"
    assert seen["wide"] == [], "figures wider than the phone"
    if name in ("index.html", f"{TABLES}.html", f"{FIGURE_PAGE}.html"):  # for a person to look at
        page.screenshot(path=str(SHOTS / f"site_{name.removesuffix('.html')}_phone.png"))


def _edges(box) -> tuple[float, float]:
    """The mean brightness of the box's leftmost and rightmost 2 px, as shown."""
    import io

    from PIL import Image, ImageStat

    image = Image.open(io.BytesIO(box.screenshot())).convert("L")
    width, height = image.size
    left = ImageStat.Stat(image.crop((0, 0, 2, height))).mean[0]
    right = ImageStat.Stat(image.crop((width - 2, 0, width, height))).mean[0]
    return left, right


def _shows_it_scrolls(page, box, name: str) -> None:
    """`box` scrolls sideways, not the page, and shades the side where more is hidden."""
    assert box.evaluate("b => b.scrollWidth > b.clientWidth"), f"no wide {name} to look at"
    box.scroll_into_view_if_needed()
    box.evaluate("b => { b.scrollLeft = 0; }")
    left, right = _edges(box)
    assert right < left - 30, f"a wide {name} does not show that it scrolls ({left}, {right})"
    box.screenshot(path=str(SHOTS / f"site_phone_{name}.png"))
    box.evaluate("b => { b.scrollLeft = b.scrollWidth; }")
    assert box.evaluate("b => b.scrollLeft > 0") and page.evaluate("scrollX") == 0
    left, right = _edges(box)
    assert left < right - 30, f"a wide {name} scrolled to its end shades the wrong side"
    box.screenshot(path=str(SHOTS / f"site_phone_{name}_scrolled.png"))


WIDEST = """boxes => boxes.map((b) => b.scrollWidth - b.clientWidth)
  .reduce((best, hidden, i, all) => hidden > all[best] ? i : best, 0)"""  # the most hidden


def test_on_a_phone_a_wide_table_or_listing_scrolls_in_its_box_and_shows_it(tab) -> None:
    page = tab.visit(f"{TABLES}.html")
    page.set_viewport_size(PHONE)
    tables = page.locator("article .md-typeset__scrollwrap")
    _shows_it_scrolls(page, tables.nth(tables.evaluate_all(WIDEST)), "table")
    code = page.locator("article pre > code")
    _shows_it_scrolls(page, code.nth(code.evaluate_all(WIDEST)), "listing")
    assert tab.errors == []


FITS = """img => { const r = img.getBoundingClientRect();
  return r.left >= 0 && r.top >= 0 && r.right <= innerWidth && r.bottom <= innerHeight; }"""


def test_on_a_phone_a_figure_opens_fitted_zooms_and_closes(tab) -> None:
    page = tab.visit(f"{FIGURE_PAGE}.html")
    page.set_viewport_size(PHONE)
    dialog = page.locator("dialog.figure-dialog")
    image = dialog.locator("img")

    def open_figure() -> None:
        page.locator("article a.figure-zoom").first.click()
        page.wait_for_function(
            "img => img.complete && img.naturalWidth > 0", arg=image.element_handle()
        )
        assert image.evaluate(FITS), "the figure opens larger than the screen"

    def width() -> float:
        return image.evaluate("img => img.getBoundingClientRect().width")

    open_figure()
    page.screenshot(path=str(SHOTS / "site_phone_figure_open.png"))
    fitted = width()
    assert fitted == pytest.approx(PHONE["width"], abs=1)  # drawn wider, fitted to the width
    zoom_in, zoom_out = (page.get_by_role("button", name=n) for n in ("Zoom in", "Zoom out"))
    zoom_in.click()
    zoom_in.click()
    assert width() == pytest.approx(fitted * 1.5**2, rel=0.01)
    assert dialog.evaluate("d => d.querySelector('.figure-view').scrollLeft > 0")  # its middle
    page.screenshot(path=str(SHOTS / "site_phone_figure_zoomed.png"))
    zoom_out.click()
    zoom_out.click()
    zoom_out.click()  # no smaller than fitted
    assert width() == pytest.approx(fitted, abs=1)
    page.get_by_role("button", name="Close").click()
    assert not dialog.evaluate("d => d.open")
    open_figure()
    page.keyboard.press("Escape")
    assert not dialog.evaluate("d => d.open")
    open_figure()
    page.mouse.click(PHONE["width"] / 2, PHONE["height"] - 10)  # beside the figure
    assert not dialog.evaluate("d => d.open")
    assert tab.errors == []


# --- the titles -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CHAPTERS)
def test_a_chapter_title_is_numbered_as_the_navigation_numbers_it(tab, name: str) -> None:
    chapter = BOOK.chapters[CHAPTERS.index(name)]
    numbered = f"{chapter.number}. {chapter.title}"
    page = tab.visit(f"{name}.html")
    assert page.locator("article h1").inner_text().strip() == numbered
    assert page.title() == f"{numbered} - {BOOK.title}"
    nav = page.locator(f"nav.md-nav--primary a.md-nav__link[href='{name}.html']").first
    assert nav.inner_text().strip() == numbered


@pytest.mark.parametrize("name", CHAPTERS)
def test_the_two_kinds_of_exercises_have_headings_of_their_own(tab, name: str) -> None:
    chapter = BOOK.chapters[CHAPTERS.index(name)]
    headings = _headings(tab.visit(f"{name}.html"))
    judged = sum(e.chapter == chapter.number for e in judge.exercises())
    assert headings.count("Questions, with answers") == 1
    assert [h for h in headings if h.startswith("Judged exercises")] == [
        f"Judged exercises ({judged})"
    ]
    assert not {"Exercises", "The judged exercise"} & set(headings)


@pytest.mark.parametrize("name", CHAPTERS)
def test_a_chapter_links_to_the_previous_and_the_next(tab, name: str) -> None:
    i = CHAPTERS.index(name)
    before = "index.html" if i == 0 else f"{CHAPTERS[i - 1]}.html"
    after = "practice.html" if i == len(CHAPTERS) - 1 else f"{CHAPTERS[i + 1]}.html"
    page = tab.visit(f"{name}.html")
    links = [page.locator(f"a.md-footer__link--{way}") for way in ("prev", "next")]
    assert [link.count() for link in links] == [1, 1], "no previous and next links"
    assert [link.get_attribute("href") for link in links] == [before, after]


def test_the_home_page_introduces_the_book_and_numbers_the_chapters_through(tab) -> None:
    page = tab.visit("index.html")
    assert "This book builds minisgl" in page.locator("article p").first.inner_text()
    numbered = page.eval_on_selector_all(
        "article ol",
        "lists => lists.flatMap(ol => [...ol.children].map("
        "(li, i) => [ol.start + i, li.innerText.trim()]))",
    )
    assert numbered == [[c.number, c.title] for c in BOOK.chapters]
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.screenshot(path=str(SHOTS / f"site_home_{width}.png"), full_page=True)
