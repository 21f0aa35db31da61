"""The tree at a chapter: which version of which file, the listing the book prints, diffs.

The tree at chapter N holds
  - every package file added or brought in early at or before N, in its newest version at or
    before N (a file brought in early has its own chapter's first version until that chapter);
  - the mains and tests of the chapters up to N;
  - the book-wide support files (steps.yaml's `support`), the same in every tree.
"""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path

from .book import Book, Chapter

MARKS = {
    "new": "← new in this chapter",
    "modified": "← modified in this chapter",
    "early": "← brought in early",
}


def package_files(book: Book, chapter: Chapter) -> list[str]:
    """The package files in the tree at `chapter`, in the order they were added."""
    files: list[str] = []
    for c in book.upto(chapter):
        files += [p for p in c.new if p not in files]
        files += [p for p in c.early if p not in files]
    return files


def version_at(book: Book, path: str, chapter: Chapter) -> Path:
    """The stored file holding `path` as it stands at `chapter`."""
    writes = book.history[path]
    done = [w for w in writes if w.chapter.number <= chapter.number]
    return book.stored_version(done[-1] if done else writes[0], path)


def tree_at(book: Book, chapter: Chapter, package: bool = True) -> dict[str, Path]:
    """Every file of the tree at `chapter`: its path in the tree -> the file holding it.

    With `package=False` the package is left out (a learner brings their own).
    """
    tree: dict[str, Path] = {}
    if package:
        for path in package_files(book, chapter):
            tree[f"{book.package_root}/{path}"] = version_at(book, path, chapter)
    for path in book.support_files():
        tree[path] = book.root / path
    for c in book.upto(chapter):
        for path in (c.main, *c.tests):
            tree[path] = book.root / path
    return dict(sorted(tree.items()))


def write_tree(tree: dict[str, Path], dest: Path) -> None:
    for path, source in tree.items():
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


def changes(book: Book, chapter: Chapter) -> dict[str, str]:
    """Package path -> new / modified / early, for what `chapter` itself does."""
    marks = {p: "new" for p in chapter.new}
    marks.update({p: "modified" for p in chapter.modified})
    marks.update({p: "early" for p in chapter.early})
    return marks


def listing(book: Book, chapter: Chapter) -> str:
    """The tree listing the book prints for `chapter`."""
    files = package_files(book, chapter)
    marks = changes(book, chapter)
    counts = [sum(kind == k for kind in marks.values()) for k in ("new", "modified", "early")]
    lines = [
        f"Files so far: {len(files)} ({counts[0]} new, {counts[1]} modified, "
        f"{counts[2]} brought in early)",
        "",
    ]
    tops = list(dict.fromkeys(p.split("/")[0] for p in files))
    for top in tops:
        lines.append(f"{top}/")
        inside = [p[len(top) + 1 :] for p in files if p.startswith(top + "/")]
        lines += _folder(inside, {p[len(top) + 1 :]: m for p, m in marks.items()}, "")
    return "\n".join(lines) + "\n"


def _folder(files: list[str], marks: dict[str, str], indent: str) -> list[str]:
    """A folder's own files in order of addition, then its subfolders alphabetically."""
    lines = []
    for path in files:
        if "/" not in path:
            mark = f"  {MARKS[marks[path]]}" if path in marks else ""
            lines.append(f"{indent}├── {path}{mark}")
    for sub in sorted({p.split("/")[0] for p in files if "/" in p}):
        inside = [p[len(sub) + 1 :] for p in files if p.startswith(sub + "/")]
        sub_marks = {p[len(sub) + 1 :]: m for p, m in marks.items() if p.startswith(sub + "/")}
        if sub_marks:
            lines.append(f"{indent}├── {sub}/")
            lines += _folder(inside, sub_marks, indent + "│   ")
        else:
            count = f"{len(inside)} file" + ("s" if len(inside) != 1 else "")
            lines.append(f"{indent}├── {sub}/  ({count}, unchanged)")
    return lines


def diff(book: Book, chapter: Chapter) -> str:
    """Unified diff of the tree from the chapter before to this one."""
    before = book.previous(chapter)
    old = tree_at(book, before) if before else {}
    new = tree_at(book, chapter)
    out: list[str] = []
    for path in sorted(old.keys() | new.keys()):
        a = _read_lines(old.get(path))
        b = _read_lines(new.get(path))
        if a != b:
            out += difflib.unified_diff(
                a,
                b,
                f"a/{path}" if path in old else "/dev/null",
                f"b/{path}" if path in new else "/dev/null",
            )
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in out
    )


def _read_lines(source: Path | None) -> list[str]:
    if source is None:
        return []
    return source.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
