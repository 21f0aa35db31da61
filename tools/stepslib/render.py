"""The chapter texts' directives, resolved against the chapter's own tree and expanded.

A directive is a line of its own in `chapters/<id>_<slug>/README.md`:

    @[code](minisgl/moe/base.py · select_experts)   a function, class or Class.method, taken
                                                    with `ast` from this chapter's version
    @[code](minisgl/moe/base.py)                    a whole file
    @[test](tests/test_ch20_moe.py · test_name)     a test, by name
    @[tree]                                         the tree listing (`steps.py tree N`)
    @[main]                                         the chapter's main, whole
    @[prints]                                       what the main prints (main.out)

`::` may stand for ` · `. Paths under the package's top folder (`minisgl/...`) are package
files; other paths are files of the tree (`examples/...`, `tests/...`). A file that no chapter's
tree holds (`benchmark/offline.py`, a file under `tools/`) is the repository's own, in the one
version the repository has: a chapter may show it with `@[code](benchmark/offline.py · f)`, and
the listing stays what the script runs. The package's files and the chapters' folders are never
read that way: their versions belong to the trees.

A text shows its chapter's figures (`chapters/<id>_<slug>/figures/`, drawn by
`tools/figures.py`) with ordinary links, `![...](figures/NAME.svg)`; `render` copies the folder
beside the page, as `<id>_<slug>/figures/`, and points the links there.
"""

from __future__ import annotations

import ast
import re
import shutil
import textwrap
from pathlib import Path

from .book import Book, Chapter
from .errors import BookError
from .imports import Problem
from .tree import listing, tree_at

DIRECTIVE = re.compile(r"^@\[(\w+)\](?:\((.*)\))?\s*$")
TEXT = "README.md"
PRINTS = "main.out"
FIGURES = "figures"
FIGURE_LINK = re.compile(r"\]\(figures/")  # the target of a markdown link or image


def directives(text: str) -> list[tuple[int, str, str]]:
    """(line, kind, argument) for each directive line, outside fenced code blocks."""
    found = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        match = None if fenced else DIRECTIVE.match(line)
        if match:
            found.append((number, match.group(1), (match.group(2) or "").strip()))
    return found


def expand(book: Book, chapter: Chapter, kind: str, argument: str) -> str:
    """The markdown a directive stands for; a BookError says why it does not resolve."""
    if kind == "tree":
        return f"```text\n{listing(book, chapter)}```"
    if kind == "main":
        return _code_block(chapter.main, _read(book.root / chapter.main))
    if kind == "prints":
        prints = book.root / chapter.folder / PRINTS
        if not prints.is_file():
            raise BookError(f"no recorded prints yet ({chapter.folder}/{PRINTS})")
        return f"```text\n{_read(prints)}```"
    if kind in ("code", "test"):
        path, _, symbol = argument.replace("::", " · ").partition(" · ")
        path, symbol = path.strip(), symbol.strip()
        if kind == "test" and (not path.startswith("tests/") or not symbol):
            raise BookError(f"@[test] takes `tests/FILE.py · test_name`, not {argument!r}")
        source = _source(book, chapter, path)
        code = find_symbol(_read(source), symbol, path) if symbol else _read(source)
        return _code_block(f"{path} · {symbol}" if symbol else path, code)
    raise BookError(f"unknown directive @[{kind}] (known: code, test, tree, main, prints)")


def _source(book: Book, chapter: Chapter, path: str) -> Path:
    if not path:
        raise BookError("a directive names no file")
    tree = tree_at(book, chapter)
    for candidate in (f"{book.package_root}/{path}", path):
        if candidate in tree:
            return tree[candidate]
    own = _repository_file(book, path)
    if own is not None:
        return own
    raise BookError(f"{path} is not in the tree at {chapter.id}")


def _repository_file(book: Book, path: str) -> Path | None:
    """The repository's file at `path` when no chapter's tree holds it (a benchmark script, a
    tool), else None: a tree's file shown from a later tree would show code the chapter lacks."""
    if path.startswith((f"{book.package_root}/", "chapters/")) or ".." in path.split("/"):
        return None
    if path in tree_at(book, book.chapters[-1]):  # the last tree holds every tree's files
        return None
    target = book.root / path
    return target if target.is_file() else None


def find_symbol(text: str, symbol: str, path: str) -> str:
    """The source of a function, a class, `Class.method` or an assignment to a name (a module's
    table of constants, say), dedented, decorators included."""
    body = ast.parse(text).body
    node: ast.stmt | None = None
    for part in symbol.split("."):
        candidates = [n for n in body if _defines(n, part)]
        if not candidates:
            raise BookError(f"{path} has no {symbol}")
        node = candidates[0]
        body = getattr(node, "body", [])  # an assignment has no parts to look into
    assert node is not None
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    lines = text.splitlines()[first - 1 : node.end_lineno]
    return textwrap.dedent("\n".join(lines)) + "\n"


def _defines(node: ast.stmt, name: str) -> bool:
    """Whether the statement defines ``name``: a def, a class, or ``name = ...`` (annotated or
    not)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.target, ast.Name) and node.target.id == name
    return False


def _code_block(title: str, code: str) -> str:
    return f"**`{title}`**\n\n```python\n{code.rstrip()}\n```"


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def text_problems(book: Book, chapter: Chapter) -> list[Problem]:
    """Every directive of the chapter's text that does not resolve, and every file it adds or
    changes that the text never names."""
    text_path = book.root / chapter.folder / TEXT
    shown = f"{chapter.folder}/{TEXT}"
    if not text_path.is_file():
        return [Problem(shown, "the chapter has no text")]
    text = _read(text_path)
    problems = []
    for line, kind, argument in directives(text):
        try:
            expand(book, chapter, kind, argument)
        except (BookError, SyntaxError) as e:
            problems.append(Problem(f"{shown}:{line}", str(e)))
    return problems + unnamed_files(chapter, text)


def unnamed_files(chapter: Chapter, text: str) -> list[Problem]:
    """A file the chapter adds or changes that its text never names: a reader could not find
    what changed. A listing names its file, so a shown file always passes."""
    shown = f"{chapter.folder}/{TEXT}"
    problems = []
    for path, how in [(p, "adds") for p in chapter.new] + [
        (p, "changes") for p in chapter.modified
    ]:
        short = path.partition("/")[2]  # minisgl/engine/sample.py -> engine/sample.py
        # a name of its own: core.py is not named by test_core.py
        if not re.search(rf"(?<![\w.-]){re.escape(short)}(?!\w)", text):
            problems.append(
                Problem(
                    shown,
                    f"the chapter {how} {path} but its text never names it: "
                    "show the change (@[code]) or say what changed, naming the file",
                )
            )
    return problems


def render_chapter(book: Book, chapter: Chapter) -> str:
    text_path = book.root / chapter.folder / TEXT
    lines = _read(text_path).splitlines()
    for line, kind, argument in reversed(directives("\n".join(lines))):
        try:
            lines[line - 1] = expand(book, chapter, kind, argument)
        except BookError as e:
            raise BookError(e.message, f"{chapter.folder}/{TEXT}:{line}") from None
    return "\n".join(lines) + "\n"


def render_book(book: Book, out: Path) -> list[Path]:
    """Write one page per chapter and an index into `out`, each chapter's figures beside its
    page; returns the pages written."""
    pages = {f"{c.name}.md": render_chapter(book, c) for c in book.chapters}  # all or nothing
    out.mkdir(parents=True, exist_ok=True)
    index = [f"# {book.title}", ""]
    stage = None
    for chapter in book.chapters:
        if chapter.stage != stage:
            stage = chapter.stage
            index += ["", f"## {stage}", ""]
        index.append(f"{chapter.number}. [{chapter.title}]({chapter.name}.md)")
    pages["index.md"] = "\n".join(index) + "\n"
    written = []
    for chapter in book.chapters:
        figures = book.root / chapter.folder / FIGURES
        if figures.is_dir():  # beside the page, in a folder of the chapter's own
            shutil.copytree(figures, out / chapter.name / FIGURES, dirs_exist_ok=True)
            page = pages[f"{chapter.name}.md"]
            pages[f"{chapter.name}.md"] = FIGURE_LINK.sub(f"]({chapter.name}/{FIGURES}/", page)
    for name, page in pages.items():
        (out / name).write_text(page, encoding="utf-8")
        written.append(out / name)
    return written
