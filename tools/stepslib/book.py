"""The book model: steps.yaml loaded, validated and queried.

A chapter writes package files (`new`, `modified`) and may bring in early a file of a later
chapter (`early`). The newest version of every package file lives in `<package_root>/`; a version
that a later chapter replaced is kept in the folder of the chapter that wrote it,
`chapters/<id>_<slug>/<package_root>/`. Everything here is checked when the book is loaded, so
the other modules can trust it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import BookError

STEPS_FILE = "steps.yaml"
CHAPTER_ID = re.compile(r"ch(\d{2,})")
REQUIRES = ("cpu", "gpu")
# Files that appear beside sources but are never part of a tree.
JUNK = re.compile(r"(^|/)(__pycache__|\.pytest_cache|\.ruff_cache|[^/]*\.egg-info)(/|$)|\.py[co]$")


@dataclass(frozen=True)
class Chapter:
    number: int  # from the id: ch07 -> 7
    id: str
    slug: str
    title: str
    stage: str
    main: str  # paths relative to the book root
    tests: tuple[str, ...]
    new: tuple[str, ...]  # paths relative to package_root
    modified: tuple[str, ...]
    early: tuple[str, ...]
    requires: str
    needs: tuple[str, ...]
    tolerance: float | None
    line: int  # where the chapter starts in steps.yaml

    @property
    def name(self) -> str:
        return f"{self.id}_{self.slug}"

    @property
    def folder(self) -> str:
        return f"chapters/{self.name}"


@dataclass(frozen=True)
class Write:
    """One version of a package file: written by `chapter`, as `new` or `modified`."""

    chapter: Chapter
    kind: str


@dataclass
class Book:
    root: Path
    title: str
    package_root: str
    support: tuple[str, ...]  # book-wide files outside the package, in every tree
    chapters: list[Chapter]
    preload: tuple[str, ...] = ()  # modules a warm Python imports once for every main and test
    layers: tuple[tuple[str, ...], ...] = ()  # the package's layers, bottom first (imports.py)
    history: dict[str, list[Write]] = field(default_factory=dict)  # path -> versions, in order
    added_in: dict[str, Chapter] = field(default_factory=dict)  # path -> chapter that adds it
    early_in: dict[str, Chapter] = field(default_factory=dict)  # path -> chapter bringing it early

    def chapter(self, number: int) -> Chapter:
        for chapter in self.chapters:
            if chapter.number == number:
                return chapter
        raise BookError(f"no chapter {number} in the book", STEPS_FILE)

    def upto(self, chapter: Chapter) -> list[Chapter]:
        return [c for c in self.chapters if c.number <= chapter.number]

    def previous(self, chapter: Chapter) -> Chapter | None:
        earlier = [c for c in self.chapters if c.number < chapter.number]
        return earlier[-1] if earlier else None

    def stored_version(self, write: Write, path: str) -> Path:
        """Where the version of `path` that `write` made lives."""
        if write is self.history[path][-1]:
            return self.root / self.package_root / path
        return self.root / write.chapter.folder / self.package_root / path

    def support_files(self) -> list[str]:
        """The support entries expanded to files, relative to the book root."""
        files: list[str] = []
        for entry in self.support:
            target = self.root / entry
            if target.is_dir():
                found = [p for p in target.rglob("*") if p.is_file()]
                names = (p.relative_to(self.root).as_posix() for p in found)
                files += sorted(name for name in names if not JUNK.search(name))
            else:
                files.append(entry)
        return files


def load_book(root: Path) -> Book:
    """Load and validate `root/steps.yaml`; any problem is a BookError naming file and line."""
    path = root / STEPS_FILE
    if not path.is_file():
        raise BookError(f"no {STEPS_FILE} in {root}")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_LineLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{STEPS_FILE}:{mark.line + 1}" if mark else STEPS_FILE
        raise BookError(f"not valid YAML: {getattr(e, 'problem', e)}", where) from None
    top = _expect(data, _Map, "the top level", 1)
    book = Book(
        root=root,
        title=_field(top, "title", str),
        package_root=_field(top, "package_root", str),
        support=tuple(_field(top, "support", list, default=[])),
        chapters=[],
        preload=_strings(top, "preload"),
        layers=_layers(top),
    )
    for stage in _field(top, "stages", list):
        stage = _expect(stage, _Map, "a stage", top.line)
        title = _field(stage, "title", str)
        for entry in _field(stage, "chapters", list):
            book.chapters.append(_chapter(_expect(entry, _Map, "a chapter", stage.line), title))
    _validate(book)
    return book


def _layers(top: _Map) -> tuple[tuple[str, ...], ...]:
    """`layers`: a list whose entries are a part's name or a list of names, bottom first."""
    layers = []
    for entry in _field(top, "layers", list, default=[]):
        layer = tuple(entry) if isinstance(entry, list) else (entry,)
        if not layer or not all(isinstance(name, str) and name for name in layer):
            raise BookError(
                "each entry of 'layers' is a name or a list of names", _at(top, "layers")
            )
        layers.append(layer)
    names = [name for layer in layers for name in layer]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise BookError(f"'layers' names {', '.join(twice)} twice", _at(top, "layers"))
    return tuple(layers)


def _chapter(entry: _Map, stage: str) -> Chapter:
    known = {
        "id",
        "slug",
        "title",
        "main",
        "tests",
        "new",
        "modified",
        "early",
        "requires",
        "needs",
        "tolerance",
    }
    for key in entry:
        if key not in known:
            raise BookError(f"unknown key {key!r} in a chapter", _at(entry, key))
    chapter_id = _field(entry, "id", str)
    number = CHAPTER_ID.fullmatch(chapter_id)
    if number is None:
        raise BookError(f"chapter id {chapter_id!r} is not of the form ch01", _at(entry, "id"))
    requires = _field(entry, "requires", str, default="cpu")
    if requires not in REQUIRES:
        raise BookError(f"requires must be cpu or gpu, not {requires!r}", _at(entry, "requires"))
    tolerance = _field(entry, "tolerance", (int, float, type(None)), default=None)
    return Chapter(
        number=int(number.group(1)),
        id=chapter_id,
        slug=_field(entry, "slug", str),
        title=_field(entry, "title", str),
        stage=stage,
        main=_field(entry, "main", str),
        tests=_strings(entry, "tests"),
        new=_strings(entry, "new"),
        modified=_strings(entry, "modified"),
        early=_strings(entry, "early"),
        requires=requires,
        needs=_strings(entry, "needs"),
        tolerance=None if tolerance is None else float(tolerance),
        line=entry.line,
    )


def _validate(book: Book) -> None:
    """The consistency rules: ids, listed paths, who adds what, stored versions."""
    seen: dict[str, Chapter] = {}
    for before, chapter in zip([None, *book.chapters], book.chapters):
        where = f"{STEPS_FILE}:{chapter.line}"
        if chapter.id in seen:
            raise BookError(f"chapter id {chapter.id} is used twice", where)
        if before is not None and chapter.number <= before.number:
            raise BookError(f"{chapter.id} comes after {before.id}: ids must be in order", where)
        seen[chapter.id] = chapter
        for path in (chapter.main, *chapter.tests):
            if not (book.root / path).is_file():
                raise BookError(f"{chapter.id}: {path} does not exist", where)
    for entry in book.support:
        if not (book.root / entry).exists():
            raise BookError(f"support file {entry} does not exist", STEPS_FILE)
    _collect_history(book)
    _check_versions(book)


def _collect_history(book: Book) -> None:
    for chapter in book.chapters:
        where = f"{STEPS_FILE}:{chapter.line}"
        for path in chapter.new:
            if path in book.added_in:
                other = book.added_in[path].id
                raise BookError(f"{path} is claimed twice: new in {other} and {chapter.id}", where)
            book.added_in[path] = chapter
            book.history[path] = [Write(chapter, "new")]
        for path in chapter.modified:
            if path not in book.added_in:
                raise BookError(
                    f"{chapter.id} modifies {path}, which no earlier chapter adds", where
                )
            if book.history[path][-1].chapter is chapter:
                raise BookError(f"{chapter.id} lists {path} as both new and modified", where)
            book.history[path].append(Write(chapter, "modified"))
    for chapter in book.chapters:
        where = f"{STEPS_FILE}:{chapter.line}"
        for path in chapter.early:
            owner = book.added_in.get(path)
            if owner is None:
                raise BookError(
                    f"{chapter.id} brings in {path} early, but no chapter adds it", where
                )
            if owner.number <= chapter.number:
                raise BookError(
                    f"{chapter.id} brings in {path} early, but {owner.id} adds it already", where
                )
            if path in book.early_in:
                raise BookError(f"{path} is brought in early twice", where)
            book.early_in[path] = chapter


def _check_versions(book: Book) -> None:
    """Every version exists where it belongs, and nothing is stored that no chapter wrote."""
    expected: set[Path] = set()
    for path, writes in book.history.items():
        for write in writes:
            stored = book.stored_version(write, path)
            expected.add(stored)
            if not stored.is_file():
                kind = "newest version" if write is writes[-1] else "superseded version"
                where = f"{STEPS_FILE}:{write.chapter.line}"
                raise BookError(
                    f"the {kind} of {path} from {write.chapter.id} is missing: "
                    f"expected {stored.relative_to(book.root)}",
                    where,
                )
    stores = [book.root / book.package_root]
    stores += [book.root / c.folder / book.package_root for c in book.chapters]
    for store in stores:
        for found in sorted(store.rglob("*")) if store.is_dir() else []:
            relative = found.relative_to(book.root).as_posix()
            if found.is_file() and not JUNK.search(relative) and found not in expected:
                raise BookError(
                    "no chapter of steps.yaml writes this file (an orphaned version?)", relative
                )


# --- YAML with line numbers -------------------------------------------------------------------


class _Map(dict):
    """A mapping that remembers the line of each key, for error messages."""

    line: int = 1
    lines: dict[str, int]


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> _Map:
    loader.flatten_mapping(node)
    mapping = _Map()
    mapping.line, mapping.lines = node.start_mark.line + 1, {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in mapping:
            raise BookError(f"key {key!r} appears twice", f"{STEPS_FILE}:{line}")
        mapping[key] = loader.construct_object(value_node, deep=True)
        mapping.lines[key] = line
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)


def _at(mapping: _Map, key: str) -> str:
    return f"{STEPS_FILE}:{mapping.lines.get(key, mapping.line)}"


_MISSING = object()


def _field(mapping: _Map, key: str, kind: Any, default: Any = _MISSING) -> Any:
    if key not in mapping:
        if default is _MISSING:
            raise BookError(f"missing key {key!r}", f"{STEPS_FILE}:{mapping.line}")
        return default
    value = mapping[key]
    if value is None and default is not _MISSING and isinstance(default, list):
        return default
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BookError(f"{key!r} has the wrong type ({type(value).__name__})", _at(mapping, key))
    return value


def _strings(mapping: _Map, key: str) -> tuple[str, ...]:
    values = _field(mapping, key, list, default=[])
    for value in values:
        if not isinstance(value, str):
            raise BookError(f"{key!r} must be a list of paths", _at(mapping, key))
    if len(set(values)) != len(values):
        raise BookError(f"{key!r} lists a path twice", _at(mapping, key))
    return tuple(values)


def _expect(value: Any, kind: type, what: str, line: int) -> Any:
    if not isinstance(value, kind):
        raise BookError(f"{what} must be a mapping", f"{STEPS_FILE}:{line}")
    return value


def parse_selection(book: Book, text: str | None) -> list[Chapter]:
    """`20`, `ch20`, `ch20_moe` (a chapter's folder name), `3-7`, `ch03-ch07` and commas joining
    them; None means every chapter."""
    if text is None:
        return list(book.chapters)
    numbers: set[int] = set()
    names = {c.name for c in book.chapters}
    for part in text.split(","):
        ends = [e.strip() for e in part.split("-")]
        if len(ends) > 2 or not all(re.fullmatch(r"(?:ch)?\d+", e) or e in names for e in ends):
            raise BookError(
                f"not a chapter or a range: {part!r} (write 20, ch20, ch20_moe, 3-7 or ch03-ch07)"
            )
        first, last = (_chapter_number(book, e) for e in (ends[0], ends[-1]))
        if first > last:
            raise BookError(f"the range {part!r} runs backwards")
        numbers |= {c.number for c in book.chapters if first <= c.number <= last}
    return [c for c in book.chapters if c.number in numbers]


def _chapter_number(book: Book, text: str) -> int:
    """The number of the chapter `text` names: `20`, `ch20` or `ch20_moe`."""
    for chapter in book.chapters:
        if chapter.name == text:
            return chapter.number
    number = int(text.removeprefix("ch"))
    if all(c.number != number for c in book.chapters):
        known = ", ".join(c.id for c in book.chapters) or "none"
        raise BookError(f"no chapter {text} in the book (chapters: {known})")
    return number
