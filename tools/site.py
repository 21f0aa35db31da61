#!/usr/bin/env python3
"""The book as a website: `python tools/site.py build [--out build/site]`.

`steps.py render` writes the chapter pages (code listings, tree, main and prints expanded, the
figures beside them); this adds to each chapter page its practice exercises (the statement, an
editor with the starter and a Run button that runs the tests in the reader's browser through
Pyodide, or the command that judges it locally) and, once steps.yaml says `published: true`,
the "Edit this page · Report an issue" links to its `repository`, writes the home page
(tools/site_assets/home.md and the chapters, numbered through the stages), then has
mkdocs-material build the site with `--strict`, so a broken link fails the build as an
unresolved directive does. The site makes no request beyond its own files: Pyodide's come
from the npm package (`npm ci`, pinned in package-lock.json), the fonts are the reader's own,
and the repository widget (which asks api.github.com) appears only once steps.yaml says
`published: true`.

Needs the `site` extra (`pip install -e '.[site]'`) and `npm ci`.
"""

from __future__ import annotations

import argparse
import html
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import yaml

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

from stepslib.book import Book, Chapter, load_book  # noqa: E402
from stepslib.errors import BookError  # noqa: E402
from stepslib.render import render_book  # noqa: E402

ROOT = TOOLS.parent
ASSETS = TOOLS / "site_assets"  # the site's scripts and styles, and the home page's text
PYODIDE = "node_modules/pyodide"  # under the book's folder
PYODIDE_FILES = (
    "pyodide.mjs",
    "pyodide.asm.mjs",
    "pyodide.asm.wasm",
    "python_stdlib.zip",
    "pyodide-lock.json",
)
BRANCH = "main"
HEADING = re.compile(r"^(#+) ")
FIGURE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+/figures/[^)\s]+)\)")  # an image in a page
# The chapter texts' own exercise headings, and the judged exercises this page adds, named so
# that a reader tells them apart; a text's "The judged exercise" repeats the statement shown
# in full at the end of the page, so the site leaves it out.
QUESTIONS = "## Questions, with answers {#questions}"
JUDGED = "Judged exercises"


# --- the exercises ----------------------------------------------------------------------------


def load_judge(root: Path):
    """The book's practice/judge.py as a module: it knows what an exercise is."""
    spec = importlib.util.spec_from_file_location("site_judge", root / "practice" / "judge.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def exercises_by_chapter(book: Book, judge) -> dict[int, list]:
    """Each chapter's exercises; one whose chapter is not in the book is an error."""
    numbers = {c.number for c in book.chapters}
    found: dict[int, list] = {}
    for exercise in judge.exercises(book.root / "practice"):
        if exercise.chapter not in numbers:
            raise BookError(
                f"exercise {exercise.id} is for chapter {exercise.chapter}, "
                "which the book does not have",
                f"practice/{exercise.folder.name}",
            )
        found.setdefault(exercise.chapter, []).append(exercise)
    return found


def statement(exercise) -> str:
    """The statement, its headings two levels down; its first line gets the exercise's anchor."""
    lines, fenced = [], False
    for line in exercise.file("README.md").read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        lines.append("##" + line if not fenced and HEADING.match(line) else line)
    lines[0] += f" {{#exercise-{exercise.id}}}"
    return "\n".join(lines)


def exercise_block(exercise) -> str:
    command = f"python practice/judge.py {exercise.id}"
    parts = [statement(exercise), ""]
    if exercise.runs == "browser":
        starter = exercise.file("starter.py").read_text(encoding="utf-8")
        parts += [
            f'<div class="practice" data-exercise="{exercise.id}" '
            f'data-starter="{html.escape(json.dumps(starter))}">',
            '<textarea class="practice-editor" spellcheck="false" autocapitalize="off" '
            f'aria-label="your solution to exercise {exercise.id}"></textarea>',
            '<p class="practice-buttons">'
            '<button type="button" class="md-button md-button--primary practice-run">'
            "Run the tests</button> "
            '<button type="button" class="md-button practice-reset">Back to the starter'
            "</button></p>",
            '<pre class="practice-output" aria-live="polite"></pre>',
            "</div>",
            "",
            f"The same tests judge it locally: `{command} mine.py`.",
        ]
    else:
        starter = exercise.file("starter.py").read_text(encoding="utf-8").rstrip()
        parts += [
            "This exercise needs torch or numpy, which the browser's Python does not have: "
            f"judge it locally with `{command}` (it starts from `practice/work/"
            f"{exercise.id}.py`, a copy of the starter).",
            "",
            "```python",
            starter,
            "```",
        ]
    return "\n".join(parts)


def exercises_section(exercises: list) -> str:
    if not exercises:
        return ""
    items = [f"- [{e.id}. {e.title} ({e.difficulty})](#exercise-{e.id})" for e in exercises]
    blocks = [exercise_block(e) for e in exercises]
    return "\n\n".join(
        [
            f"## {JUDGED} ({len(exercises)}) {{#judged-exercises}}",
            "Write the code and run the tests in your browser, or judge locally with "
            "`python practice/judge.py`.",
            "\n".join(items),
            *blocks,
        ]
    )


# --- the pages --------------------------------------------------------------------------------


def footer(repository: str | None, chapter: Chapter) -> str:
    """The edit and issue links, none while the repository is not public (they would 404)."""
    if repository is None:
        return ""
    edit = f"{repository}/edit/{BRANCH}/{chapter.folder}/README.md"
    issue = f"{repository}/issues/new?title={quote(f'{chapter.id}: ')}"
    return (
        f"---\n\nFound a mistake or a better way to say it? [Edit this page on GitHub]({edit})"
        f" · [Report an issue]({issue})"
    )


def site_sections(page: str) -> str:
    """The text's "Exercises" renamed for what they are, its "The judged exercise" left out."""
    lines, fence, skipping = [], "", False
    for line in page.splitlines():
        marker = line.lstrip()[:3]
        if marker in ("```", "~~~") and fence in ("", marker):  # a fence closes with its own
            fence = "" if fence else marker
        heading = not fence and line.startswith("## ")
        if heading:
            skipping = line.rstrip() == "## The judged exercise"
        if skipping:
            continue
        lines.append(QUESTIONS if heading and line.rstrip() == "## Exercises" else line)
    return "\n".join(lines)


def zoomable_figures(page: str) -> str:
    """Each figure a link to its own SVG: site.js opens it in a viewer, fitted to the window's
    width up to its drawn size (where its smallest text is readable), with zoom buttons; without
    script the link opens the file."""
    return FIGURE.sub(r'[![\1](\2)](\2){.figure-zoom title="Click to enlarge"}', page)


def numbered_title(page: str, chapter: Chapter) -> str:
    """The page's h1 numbered as the navigation and the window's title number it ("5. The
    paged KV cache")."""
    first, _, rest = page.partition("\n")
    if not first.startswith("# "):
        raise BookError("a chapter page starts with its `# title`", f"{chapter.folder}/README.md")
    return f"# {chapter.number}. {first[2:]}\n{rest}"


def chapter_page(page: str, chapter: Chapter, exercises: list, repository: str | None) -> str:
    page = numbered_title(page, chapter)
    page = page.replace("<details>", '<details markdown="1">')  # their answers are markdown
    page = zoomable_figures(site_sections(page))
    section = exercises_section(exercises)
    return "\n\n".join(p for p in (page.rstrip(), section, footer(repository, chapter)) if p) + "\n"


def practice_page(book: Book, by_chapter: dict[int, list]) -> str:
    rows = ["| id | chapter | exercise | difficulty | runs |", "| --- | --- | --- | --- | --- |"]
    for chapter in book.chapters:
        for e in by_chapter.get(chapter.number, []):
            where = "in the browser" if e.runs == "browser" else "locally (torch)"
            rows.append(
                f"| {e.id} | {chapter.number}. {chapter.title} | "
                f"[{e.title}]({chapter.name}.md#exercise-{e.id}) | {e.difficulty} | "
                f"{where} |"
            )
    return "\n".join(
        [
            "# Practice",
            "",
            "Every chapter ends with exercises taken from its own code: write a function, then run "
            "its tests in the browser, or judge it locally:",
            "",
            "```bash",
            "python practice/judge.py --list          # every exercise, the solved ones marked",
            "python practice/judge.py 171             # judges practice/work/171.py",
            "python practice/judge.py 171 mine.py     # or a file of yours",
            "```",
            "",
            *rows,
            "",
        ]
    )


def home_page(book: Book) -> str:
    """The introduction, then the chapters by stage, numbered through the book: a markdown list
    would start again at 1 under each stage's heading (Python-Markdown ignores its first number),
    so each stage's list is an `<ol start=N>`."""
    parts = [(ASSETS / "home.md").read_text(encoding="utf-8").rstrip()]
    stages: dict[str, list[Chapter]] = {}
    for chapter in book.chapters:
        stages.setdefault(chapter.stage, []).append(chapter)
    for stage, chapters in stages.items():
        items = [f"<li markdown>[{c.title}]({c.name}.md)</li>" for c in chapters]
        parts.append(
            "\n".join(
                [f"## {stage}", "", f'<ol start="{chapters[0].number}" markdown>', *items, "</ol>"]
            )
        )
    parts.append(
        "[Practice](practice.md): the exercises of every chapter, judged in your "
        "browser or locally."
    )
    return "\n\n".join(parts) + "\n"


def mkdocs_config(book: Book, repository: str | None, docs: Path, out: Path) -> dict:
    """The site's configuration; `repository` (None until the book is published) gives the
    header's repository widget, which asks api.github.com for its stars."""
    nav: list = [{"Home": "index.md"}]
    stages: dict[str, list] = {}
    for chapter in book.chapters:
        stages.setdefault(chapter.stage, []).append(
            {f"{chapter.number}. {chapter.title}": f"{chapter.name}.md"}
        )
    nav += [{stage: pages} for stage, pages in stages.items()]
    nav.append({"Practice": "practice.md"})
    config = {
        "site_name": book.title,
        "docs_dir": str(docs),
        "site_dir": str(out),
        "use_directory_urls": False,
        "strict": True,
        "validation": {
            "nav": {"omitted_files": "warn", "not_found": "warn"},
            "links": {"not_found": "warn", "anchors": "warn", "unrecognized_links": "warn"},
        },
        # font: false keeps the reader's own fonts (no Google Fonts); the table of contents
        # sits in the left sidebar, which leaves the text column room for 100-column code
        "theme": {
            "name": "material",
            "font": False,
            "features": [
                "navigation.sections",
                "navigation.top",
                "navigation.footer",
                "toc.integrate",
                "search.highlight",
                "content.code.copy",
                "toc.follow",
            ],
        },
        "plugins": ["search"],
        "markdown_extensions": [
            "tables",
            "attr_list",
            "md_in_html",
            "admonition",
            "pymdownx.superfences",
            # a span per line: site.js and site.css wrap a long one
            {"pymdownx.highlight": {"line_spans": "__span"}},
            {"toc": {"permalink": True}},
        ],
        "extra_css": ["assets/site.css", "assets/practice.css"],
        "extra_javascript": ["assets/site.js", "assets/practice.js"],
        "nav": nav,
    }
    if repository:
        config.update(repo_url=repository, edit_uri="")
    return config


# --- the build --------------------------------------------------------------------------------


def _steps_yaml(root: Path) -> dict:
    data = yaml.safe_load((root / "steps.yaml").read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def repository_url(root: Path) -> str:
    url = _steps_yaml(root).get("repository")
    if not isinstance(url, str) or not url.startswith("https://"):
        raise BookError(
            "steps.yaml needs `repository: https://...`, the site's edit and issue "
            "links point there",
            "steps.yaml",
        )
    return url.rstrip("/")


def published(root: Path) -> bool:
    """steps.yaml's `published`: whether `repository` is a real repository yet."""
    flag = _steps_yaml(root).get("published", False)
    if not isinstance(flag, bool):
        raise BookError("steps.yaml's `published` is true or false", "steps.yaml")
    return flag


def public_repository(root: Path) -> str | None:
    """steps.yaml's `repository` once the book is published, else None."""
    return repository_url(root) if published(root) else None


def write_docs(book: Book, docs: Path) -> None:
    """Every page and file the site serves, into `docs`."""
    repository = public_repository(book.root)
    judge = load_judge(book.root)
    by_chapter = exercises_by_chapter(book, judge)
    render_book(book, docs)
    for chapter in book.chapters:
        page = docs / f"{chapter.name}.md"
        text = chapter_page(
            page.read_text(encoding="utf-8"),
            chapter,
            by_chapter.get(chapter.number, []),
            repository,
        )
        page.write_text(text, encoding="utf-8")
    (docs / "practice.md").write_text(practice_page(book, by_chapter), encoding="utf-8")
    (docs / "index.md").write_text(home_page(book), encoding="utf-8")
    _copy_practice(book.root, docs, by_chapter)
    _copy_pyodide(book.root / PYODIDE, docs)
    shutil.copytree(
        ASSETS, docs / "assets", dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.md")
    )  # home.md is the home page's text


def _copy_practice(root: Path, docs: Path, by_chapter: dict[int, list]) -> None:
    """The runner and each browser exercise's tests: never a reference solution."""
    target = docs / "practice"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(root / "practice" / "runner.py", target / "runner.py")
    for exercises in by_chapter.values():
        for e in exercises:
            if e.runs == "browser":
                (target / e.id).mkdir(exist_ok=True)
                shutil.copy(e.file("tests.py"), target / e.id / "tests.py")


def _copy_pyodide(pyodide: Path, docs: Path) -> None:
    missing = [name for name in PYODIDE_FILES if not (pyodide / name).is_file()]
    if missing:
        raise BookError(
            f"Pyodide is not installed ({missing[0]} is missing): run `npm ci`", str(pyodide)
        )
    (docs / "pyodide").mkdir(parents=True, exist_ok=True)
    for name in PYODIDE_FILES:
        shutil.copy(pyodide / name, docs / "pyodide" / name)


def build(root: Path, out: Path) -> int:
    book = load_book(root)
    source = out.parent / f"{out.name}-src"  # the generated docs and mkdocs.yml, to read
    if source.exists():
        shutil.rmtree(source)
    docs = source / "docs"
    write_docs(book, docs)
    repository = public_repository(root)
    config = mkdocs_config(book, repository, docs, out)
    (source / "mkdocs.yml").write_text(
        yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8"
    )
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # a banner about mkdocs 2, not the book
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--clean",
            "--quiet",
            "-f",
            str(source / "mkdocs.yml"),
        ],
        env=env,
    )
    if done.returncode == 0:
        print(
            f"wrote the site to {out} (open {out / 'index.html'}, or serve it: "
            f"python -m http.server --bind 127.0.0.1 -d {out})"
        )
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="site.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("build", help="build the site (mkdocs build --strict)")
    one.add_argument("--out", type=Path, help="default: BOOK/build/site")
    one.add_argument(
        "--root",
        type=Path,
        default=ROOT,
        help="the book's folder (default: the one holding tools/)",
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        return build(root, (args.out or root / "build" / "site").resolve())
    except BookError as e:
        print(f"site.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
