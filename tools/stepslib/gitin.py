"""`import DIR`: an edited `checkout --git` history written back into the book.

A maintainer checks the book out as history (one commit per chapter), edits a chapter's commit
with `git rebase -i`, resolves what git shows, and brings the history back. From the commits this
module works out every package file's versions (a chapter writes a version where the file
changes from the chapter before), writes the newest to `<package_root>/` and the others to the
folders of the chapters that wrote them, drops stored versions no chapter writes any more, and
rewrites steps.yaml's `new` and `modified` lists where they change. A file outside the package
(a main, a test, a support file) has one version for the whole book, so it must be the same in
every commit that holds it. Nothing is written unless the whole history can be brought back, and
the book is reloaded afterwards and every chapter's tree compared with its commit.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .book import JUNK, STEPS_FILE, Book, Chapter, load_book
from .errors import BookError
from .tree import tree_at

SUBJECT = re.compile(r"(ch\d{2,}): ")
LISTS = ("new", "modified", "early")


@dataclass(frozen=True)
class Snapshot:
    """One chapter's commit: its files, path -> blob id."""

    chapter: Chapter
    commit: str
    files: dict[str, str]


@dataclass
class Plan:
    """What the import writes: file contents by book path, files to remove, the new lists."""

    writes: dict[str, bytes] = field(default_factory=dict)
    removals: list[str] = field(default_factory=list)
    lists: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (id, key) -> paths
    kept: set[str] = field(default_factory=set)  # uncommitted work the history leaves be


def import_git(
    book: Book, folder: Path, rev: str = "HEAD", force: bool = False, dry_run: bool = False
) -> list[str]:
    """Bring the history at `folder` back into `book`; returns one line per change."""
    git = _Git(folder)
    snapshots = read_history(book, git, rev)
    plan = make_plan(book, snapshots, git)
    if not force:
        _spare_uncommitted(book, plan)
    changes = _describe(book, plan)
    if dry_run or not changes:
        return changes + [
            f"kept     {path} (uncommitted, unchanged in the history)" for path in sorted(plan.kept)
        ]
    apply_plan(book, plan)
    _verify(load_book(book.root), snapshots, git, plan.kept)
    return changes + [
        f"kept     {path} (uncommitted, unchanged in the history)" for path in sorted(plan.kept)
    ]


# --- reading the history ----------------------------------------------------------------------


class _Git:
    def __init__(self, folder: Path) -> None:
        if not (folder / ".git").exists():
            raise BookError(
                "not a git repository (write one with `steps.py checkout N DIR --git`)", str(folder)
            )
        self.folder = folder
        self._blobs: dict[str, bytes] = {}

    def run(self, *args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(self.folder), *args], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise BookError(f"git {args[0]} failed: {done.stderr.strip()}", str(self.folder))
        return done.stdout

    def files(self, commit: str) -> dict[str, str]:
        listed = self.run("ls-tree", "-r", "-z", commit).split("\0")
        entries = (line.split("\t", 1) for line in listed if line)
        return {path: meta.split()[2] for meta, path in entries if not JUNK.search(path)}

    def blob(self, sha: str) -> bytes:
        if sha not in self._blobs:
            done = subprocess.run(
                ["git", "-C", str(self.folder), "cat-file", "blob", sha], capture_output=True
            )
            if done.returncode != 0:
                raise BookError(f"git cannot read blob {sha}", str(self.folder))
            self._blobs[sha] = done.stdout
        return self._blobs[sha]


def read_history(book: Book, git: _Git, rev: str) -> list[Snapshot]:
    """The chapters' commits, oldest first; every chapter of the book exactly once, in order."""
    status = git.run("status", "--porcelain", "-z").split("\0")
    if any(entry[3:] and not JUNK.search(entry[3:]) for entry in status):
        raise BookError(
            "has uncommitted changes: commit them to the chapter they belong to "
            "(git commit --amend, or git rebase --continue)",
            str(git.folder),
        )
    log = git.run("log", "--first-parent", "--reverse", "--format=%H %s", rev).splitlines()
    wanted = [c.id for c in book.chapters]
    by_id = {c.id: c for c in book.chapters}
    snapshots: list[Snapshot] = []
    for line in log:
        commit, _, subject = line.partition(" ")
        found = SUBJECT.match(subject)
        if found is None or found.group(1) not in by_id:
            raise BookError(
                f"commit {commit[:10]} ({subject!r}) is not a chapter's commit: "
                "fold it into the chapter it belongs to (git rebase -i, 'fixup')",
                str(git.folder),
            )
        snapshots.append(Snapshot(by_id[found.group(1)], commit, git.files(commit)))
    ids = [s.chapter.id for s in snapshots]
    if ids != wanted:
        if ids == wanted[: len(ids)]:
            raise BookError(
                f"the history ends at {ids[-1] if ids else 'no chapter'}, the book at "
                f"{wanted[-1]}: an edit is carried through every chapter, so write "
                f"them all (steps.py checkout {book.chapters[-1].number} DIR --git)",
                str(git.folder),
            )
        raise BookError(
            f"the commits name the chapters {', '.join(ids)}; the book has "
            f"{', '.join(wanted)}, one commit each, in order",
            str(git.folder),
        )
    return snapshots


# --- working out the versions -----------------------------------------------------------------


def make_plan(book: Book, snapshots: list[Snapshot], git: _Git) -> Plan:
    plan = Plan()
    _plan_outside_package(book, snapshots, git, plan)
    _plan_package(book, snapshots, git, plan)
    return plan


def _plan_outside_package(book: Book, snapshots: list[Snapshot], git: _Git, plan: Plan) -> None:
    """Mains, tests and support files: one version each, the same in every commit."""
    prefix = book.package_root + "/"
    seen: dict[str, tuple[str, Chapter]] = {}
    for snapshot in snapshots:
        files = {p: b for p, b in snapshot.files.items() if not p.startswith(prefix)}
        expected = set(tree_at(book, snapshot.chapter, package=False))
        for path in sorted(files.keys() - expected):
            raise BookError(
                f"{snapshot.chapter.id} adds {path}, outside the package: the book "
                "keeps one version of such a file, named in steps.yaml (a chapter's "
                "main or tests, or `support`); add it there first",
                str(git.folder),
            )
        for path in sorted(expected - files.keys()):
            raise BookError(
                f"{snapshot.chapter.id} removes {path}, which steps.yaml names: "
                "remove it from steps.yaml first",
                str(git.folder),
            )
        for path, blob in files.items():
            first = seen.setdefault(path, (blob, snapshot.chapter))
            if first[0] != blob:
                raise BookError(
                    f"{path} differs between {first[1].id} and {snapshot.chapter.id}: "
                    "a file outside the package has one version for the whole book; "
                    f"make the edit in {first[1].id}'s commit and let the rebase "
                    "carry it",
                    str(git.folder),
                )
    for path, (blob, _) in seen.items():
        plan.writes[path] = git.blob(blob)


def _plan_package(book: Book, snapshots: list[Snapshot], git: _Git, plan: Plan) -> None:
    """Each package file's versions: where it first appears, then wherever it changes."""
    prefix = book.package_root + "/"
    trees = [
        {p[len(prefix) :]: b for p, b in s.files.items() if p.startswith(prefix)} for s in snapshots
    ]
    new: list[set[str]] = [set() for _ in snapshots]
    modified: list[set[str]] = [set() for _ in snapshots]
    early: list[set[str]] = [set() for _ in snapshots]
    writes: dict[str, list[int]] = {}  # path -> indices of the snapshots that write a version
    for i, (snapshot, tree) in enumerate(zip(snapshots, trees)):
        before = trees[i - 1] if i else {}
        for path in sorted(before.keys() - tree.keys()):
            raise BookError(
                f"{snapshot.chapter.id} deletes {prefix}{path}: a chapter cannot "
                "remove a file an earlier chapter wrote",
                str(git.folder),
            )
        for path in tree.keys() - before.keys():
            owner = _early_owner(book, snapshots, trees, i, path, git)
            if owner is not None:  # listed as early here, and new in its own chapter
                early[i].add(path)
            new[i if owner is None else owner].add(path)
            writes[path] = [i if owner is None else owner]
        for path in tree.keys() & before.keys():
            if tree[path] != before[path]:
                modified[i].add(path)
                writes[path].append(i)
    for i, snapshot in enumerate(snapshots):
        for key, found in (("new", new), ("modified", modified), ("early", early)):
            plan.lists[(snapshot.chapter.id, key)] = _in_order(found[i], snapshot.chapter, key)
    for path, indices in writes.items():
        for n, i in enumerate(indices):
            chapter = snapshots[i].chapter
            home = prefix if n == len(indices) - 1 else f"{chapter.folder}/{prefix}"
            plan.writes[home + path] = git.blob(trees[i][path])
    kept = set(plan.writes)
    stores = [book.root / book.package_root] + [
        book.root / c.folder / book.package_root for c in book.chapters
    ]
    for store in stores:
        for found in sorted(store.rglob("*")) if store.is_dir() else []:
            relative = found.relative_to(book.root).as_posix()
            if found.is_file() and not JUNK.search(relative) and relative not in kept:
                plan.removals.append(relative)


def _in_order(paths: set[str], chapter: Chapter, key: str) -> list[str]:
    """`paths` in the order steps.yaml lists them for `chapter`, the rest after, sorted: the
    order of `new` is the order of the tree listing."""
    known = [p for p in getattr(chapter, key) if p in paths]
    return known + sorted(paths - set(known))


def _early_owner(
    book: Book, snapshots: list[Snapshot], trees: list[dict[str, str]], i: int, path: str, git: _Git
) -> int | None:
    """Where `path` is new when snapshot i brings it in early as steps.yaml says, else None.

    The tree shows an early file's own first version until its chapter, so every commit from
    the early one to the owner's must hold the same file.
    """
    if book.early_in.get(path) is not snapshots[i].chapter:
        return None
    owner = next(j for j, s in enumerate(snapshots) if s.chapter is book.added_in[path])
    blobs = {trees[j].get(path) for j in range(i, owner + 1)}
    if len(blobs) != 1:
        raise BookError(
            f"{book.package_root}/{path} is brought in early by "
            f"{snapshots[i].chapter.id} and so must be its own chapter's first "
            f"version until {snapshots[owner].chapter.id}; it changes in between",
            str(git.folder),
        )
    return owner


# --- writing ----------------------------------------------------------------------------------


def _describe(book: Book, plan: Plan) -> list[str]:
    lines = []
    for path, data in sorted(plan.writes.items()):
        target = book.root / path
        if not target.is_file():
            lines.append(f"added    {path}")
        elif target.read_bytes() != data:
            lines.append(f"changed  {path}")
    lines += [f"removed  {path}" for path in plan.removals]
    for chapter in book.chapters:
        for key in LISTS:
            old, new = list(getattr(chapter, key)), plan.lists[(chapter.id, key)]
            if old != new:
                lines.append(f"{STEPS_FILE}: {chapter.id} {key}: {_listed(old)} -> {_listed(new)}")
    return lines


def _listed(paths: list[str]) -> str:
    return "[" + ", ".join(paths) + "]"


def _spare_uncommitted(book: Book, plan: Plan) -> None:
    """Leave alone a file with uncommitted changes that the history does not change (its
    content there is the committed one); refuse to overwrite or remove one that it does."""
    if not (book.root / ".git").exists():
        return
    done = subprocess.run(
        ["git", "-C", str(book.root), "status", "--porcelain", "-z"], capture_output=True, text=True
    )
    dirty = {entry[3:] for entry in done.stdout.split("\0") if len(entry) > 3}
    clash = sorted(p for p in plan.removals if p in dirty)
    for path in sorted(dirty & plan.writes.keys()):
        target = book.root / path
        if target.is_file() and target.read_bytes() == plan.writes[path]:
            continue
        if _committed(book, path) == plan.writes[path]:
            del plan.writes[path]  # someone's work in progress, which the history leaves be
            plan.kept.add(path)
        else:
            clash.append(path)
    if clash:
        raise BookError(
            f"uncommitted changes in {', '.join(clash[:5])}"
            + (f" and {len(clash) - 5} more" if len(clash) > 5 else "")
            + ", which the history changes: commit or stash them first, or pass --force to "
            "overwrite them",
            str(book.root),
        )


def _committed(book: Book, path: str) -> bytes | None:
    done = subprocess.run(
        ["git", "-C", str(book.root), "show", f"HEAD:{path}"], capture_output=True
    )
    return done.stdout if done.returncode == 0 else None


def apply_plan(book: Book, plan: Plan) -> None:
    for path, data in plan.writes.items():
        target = book.root / path
        if target.is_file() and target.read_bytes() == data:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    for path in plan.removals:
        target = book.root / path
        target.unlink()
        for folder in target.parents:
            if folder == book.root or any(folder.iterdir()):
                break
            folder.rmdir()
    steps = book.root / STEPS_FILE
    text = steps.read_text(encoding="utf-8")
    for chapter in book.chapters:
        for key in LISTS:
            paths = plan.lists[(chapter.id, key)]
            if list(getattr(chapter, key)) != paths:
                text = rewrite_list(text, chapter.id, key, paths)
    if text != steps.read_text(encoding="utf-8"):
        steps.write_text(text, encoding="utf-8")


def rewrite_list(text: str, chapter_id: str, key: str, paths: list[str]) -> str:
    """steps.yaml with one chapter's `key` list replaced; every other line kept as it is."""
    lines = text.splitlines(keepends=True)
    start = next(
        (i for i, line in enumerate(lines) if re.fullmatch(rf"\s*- id: {chapter_id}\s*", line)),
        None,
    )
    if start is None:
        raise BookError(f"no '- id: {chapter_id}' line to rewrite", STEPS_FILE)
    indent = " " * (lines[start].index("-") + 2)
    end = start + 1
    while end < len(lines) and (lines[end].startswith(indent) or not lines[end].strip()):
        end += 1
    block = _key_lines(lines, start, end, indent)
    item = f"{indent}  - "  # or the style the list already has
    if key in block and block[key][1] - block[key][0] > 1:
        first_item = lines[block[key][0] + 1]
        item = first_item[: first_item.index("- ") + 2]
    spelled = [f"{indent}{key}:\n"] + [f"{item}{p}\n" for p in paths] if paths else []
    if key in block:
        first, last = block[key]
        return "".join(lines[:first] + spelled + lines[last:])
    before = [block[k][1] for k in LISTS[: LISTS.index(key)] if k in block]
    at = max(before) if before else block.get("requires", (end, end))[0]
    return "".join(lines[:at] + spelled + lines[at:])


def _key_lines(lines: list[str], start: int, end: int, indent: str) -> dict[str, tuple[int, int]]:
    """Each key of a chapter's block -> the lines it spans, its value's lines included."""
    spans: dict[str, tuple[int, int]] = {}
    key, first = None, start
    for i in range(start, end + 1):
        inside = lines[i].startswith((indent + " ", indent + "- ")) if i < end else False
        at_key = i == start or not inside  # items may sit at the key's own indentation
        if not at_key:
            continue
        if key is not None:
            spans[key] = (first, i)
        if i < end:
            text = lines[i][len(indent) :] if i > start else lines[i].split("- ", 1)[1]
            key, first = text.split(":", 1)[0].strip(), i
    return spans


def _verify(book: Book, snapshots: list[Snapshot], git: _Git, kept: set[str]) -> None:
    """Every chapter's tree, rebuilt from what was written, is its commit byte for byte (but
    for the uncommitted work that was kept)."""
    for snapshot in snapshots:
        tree = tree_at(book, snapshot.chapter)
        if tree.keys() != snapshot.files.keys():
            odd = sorted(tree.keys() ^ snapshot.files.keys())
            raise BookError(
                f"after the import, the tree at {snapshot.chapter.id} differs from "
                f"its commit in {', '.join(odd[:5])}",
                str(book.root),
            )
        for path, source in tree.items():
            written = source.relative_to(book.root).as_posix() not in kept
            if written and source.read_bytes() != git.blob(snapshot.files[path]):
                raise BookError(
                    f"after the import, {path} at {snapshot.chapter.id} differs from its commit",
                    str(book.root),
                )
