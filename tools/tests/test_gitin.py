"""`steps.py import`: an edited `checkout --git` history written back into the book."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from bookmaker import copy_real_book, steps
from conftest import snapshot
from stepslib.book import load_book
from stepslib.gitin import rewrite_list

# What the real book's import reads and writes, copied so that a test can write freely.


def _git(folder: Path, *args: str, editor: str | None = None) -> str:
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
        GIT_EDITOR="true",
    )
    if editor is not None:
        env["GIT_SEQUENCE_EDITOR"] = editor
    done = subprocess.run(
        ["git", "-C", str(folder), *args], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _history(book: Path, dest: Path, chapter: str) -> Path:
    done = steps(book, "checkout", chapter, str(dest), "--git")
    assert done.returncode == 0, done.stderr
    return dest


def _last_chapter(book: Path) -> str:
    """The book's last chapter's number: a history must hold every chapter to be imported."""
    return str(load_book(book).chapters[-1].number)


def _edit_chapter(history: Path, chapter: str, edit) -> None:
    """What a maintainer does: `git rebase -i`, 'edit' on the chapter's commit, amend, go on."""
    _git(history, "rebase", "-q", "-i", "--root", editor=f"sed -i '/ {chapter}: /s/^pick/edit/'")
    edit(history)
    _git(history, "commit", "-qa", "--amend", "--no-edit")
    _git(history, "rebase", "--continue")


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


@pytest.fixture(scope="module")
def real_book(tmp_path_factory) -> Path:
    """A copy of this repository's book (package, stored versions, mains, tests, steps.yaml)."""
    return copy_real_book(tmp_path_factory.mktemp("real") / "book")


def test_the_real_book_comes_back_byte_for_byte(real_book, tmp_path):
    before = snapshot(real_book)
    history = _history(real_book, tmp_path / "history", _last_chapter(real_book))
    done = steps(real_book, "import", str(history))
    assert done.returncode == 0, done.stderr
    assert "nothing to change" in done.stdout
    assert snapshot(real_book) == before


def test_a_one_line_edit_of_chapter_6_reaches_every_later_version(real_book, tmp_path):
    before = snapshot(real_book)
    history = _history(real_book, tmp_path / "history", _last_chapter(real_book))
    old, new = "one forward for a batch", "one forward for any batch"

    def edit(tree: Path) -> None:
        _replace(tree / "python/minisgl/engine/engine.py", old, new)

    _edit_chapter(history, "ch06", edit)
    done = steps(real_book, "import", str(history))
    assert done.returncode == 0, done.stderr
    after = snapshot(real_book)
    changed = {p for p in after if after[p] != before.get(p)}
    versions = {p for p in before if p.endswith("minisgl/engine/engine.py")}
    assert len(versions) == 11  # ch06 and the ten chapters that modify it
    assert changed == versions and after.keys() == before.keys()
    for path in versions:
        assert after[path] == before[path].replace(old.encode(), new.encode(), 1)
    for chapter in ("6", _last_chapter(real_book)):  # the tree of any chapter is its commit
        tree = tmp_path / f"tree{chapter}"
        assert steps(real_book, "checkout", chapter, str(tree)).returncode == 0
        assert new in (tree / "python/minisgl/engine/engine.py").read_text(encoding="utf-8")


def test_a_toy_history_comes_back_byte_for_byte(book, tmp_path, unchanged):
    history = _history(book, tmp_path / "history", "3")
    guard = unchanged(book)
    done = steps(book, "import", str(history))
    assert done.returncode == 0 and "nothing to change" in done.stdout
    guard.check()


def test_a_file_added_in_a_commit_is_new_in_that_chapter(book, tmp_path):
    history = _history(book, tmp_path / "history", "3")

    def edit(tree: Path) -> None:
        (tree / "python/toy/wave.py").write_text("WAVE = 'o/'\n", encoding="utf-8")
        _git(tree, "add", "python/toy/wave.py")

    _edit_chapter(history, "ch02", edit)
    done = steps(book, "import", str(history))
    assert done.returncode == 0, done.stderr
    assert "added    python/toy/wave.py" in done.stdout
    steps_yaml = (book / "steps.yaml").read_text(encoding="utf-8")
    assert "- toy/shout.py\n    - toy/wave.py\n" in steps_yaml
    assert "├── wave.py  ← new in this chapter" in steps(book, "tree", "2").stdout
    unnamed = steps(book, "check", "--static")  # the chapter's text must say what it adds
    assert unnamed.returncode == 1 and "adds toy/wave.py but its text never names" in unnamed.stdout
    text = book / "chapters/ch02_shout/README.md"
    text.write_text(text.read_text(encoding="utf-8") + "\n`toy/wave.py` waves.\n", "utf-8")
    assert steps(book, "check", "--static").returncode == 0


def test_an_undone_change_is_no_longer_a_version(book, tmp_path):
    """ch02 modifies greet.py; made equal to ch01's again, ch01's version is the newest."""
    history = _history(book, tmp_path / "history", "3")
    first = (book / "chapters/ch01_greet/python/toy/greet.py").read_bytes()

    def edit(tree: Path) -> None:
        (tree / "python/toy/greet.py").write_bytes(first)

    _edit_chapter(history, "ch02", edit)
    done = steps(book, "import", str(history))
    assert done.returncode == 0, done.stderr
    assert "removed  chapters/ch01_greet/python/toy/greet.py" in done.stdout
    assert not (book / "chapters/ch01_greet/python").exists()
    assert (book / "python/toy/greet.py").read_bytes() == first
    assert "modified" not in _chapter_block(book, "ch02") or "toy/greet.py" not in _chapter_block(
        book, "ch02"
    )
    done = steps(book, "import", str(history))
    assert "nothing to change" in done.stdout  # and it is a fixed point


def _chapter_block(book: Path, chapter_id: str) -> str:
    text = (book / "steps.yaml").read_text(encoding="utf-8")
    return text.split(f"id: {chapter_id}")[1].split("- id:")[0]


def test_dry_run_writes_nothing(book, tmp_path, unchanged):
    history = _history(book, tmp_path / "history", "3")
    _edit_chapter(
        history, "ch01", lambda t: _replace(t / "python/toy/__init__.py", "A toy", "The toy")
    )
    guard = unchanged(book)
    done = steps(book, "import", str(history), "--dry-run")
    assert done.returncode == 0 and "changed  python/toy/__init__.py" in done.stdout
    guard.check()


@pytest.mark.parametrize(
    "fault",
    [
        "stray commit",
        "short history",
        "deleted file",
        "outside file differs",
        "uncommitted",
        "early file changes",
    ],
)
def test_a_history_the_book_cannot_hold_is_refused_and_nothing_written(
    book, tmp_path, unchanged, fault
):
    history = _history(book, tmp_path / "history", "2" if fault == "short history" else "3")
    if fault == "stray commit":
        (history / "python/toy/greet.py").write_text("# a fix\n", encoding="utf-8")
        _git(history, "commit", "-qam", "fix greet")
    elif fault == "deleted file":
        _edit_chapter(history, "ch03", lambda t: _git(t, "rm", "-q", "python/toy/shout.py"))
    elif fault == "outside file differs":
        (history / "tests/helpers.py").write_text("WORDS = 1\n", encoding="utf-8")
        _git(history, "commit", "-qa", "--amend", "--no-edit")  # ch03 only
    elif fault == "uncommitted":
        (history / "python/toy/greet.py").write_text("# not yet committed\n", encoding="utf-8")
    elif fault == "early file changes":  # ch02 brings in ch03's first version: the same file
        _replace(history / "python/toy/count.py", "len(", "1 + len(")
        _git(history, "commit", "-qa", "--amend", "--no-edit")  # ch03 only
    guard = unchanged(book)
    done = steps(book, "import", str(history))
    assert done.returncode == 2, done.stdout
    expected = {
        "stray commit": "'fix greet'",
        "short history": "ends at ch02",
        "deleted file": "ch03 deletes python/toy/shout.py",
        "outside file differs": "tests/helpers.py differs between ch01 and ch03",
        "uncommitted": "uncommitted changes",
        "early file changes": "brought in early by ch02",
    }[fault]
    assert expected in done.stderr and done.stderr.count("\n") == 1
    guard.check()


def test_uncommitted_work_in_the_book_is_not_overwritten(book, tmp_path):
    _git(book, "init", "-q")
    _git(book, "add", "--all")
    _git(book, "commit", "-qm", "book")
    history = _history(book, tmp_path / "history", "3")
    _replace(history / "python/toy/greet.py", "hello, ", "hi, ")
    _git(history, "commit", "-qa", "--amend", "--no-edit")  # ch03 modifies greet.py now
    (book / "python/toy/greet.py").write_text("# work in progress\n", encoding="utf-8")
    done = steps(book, "import", str(history))
    assert done.returncode == 2 and "python/toy/greet.py" in done.stderr
    assert (book / "python/toy/greet.py").read_text() == "# work in progress\n"
    done = steps(book, "import", str(history), "--force")
    assert done.returncode == 0, done.stderr
    assert "hi, " in (book / "python/toy/greet.py").read_text()
    assert "hello, " in (book / "chapters/ch02_shout/python/toy/greet.py").read_text()


BLOCK = """stages:
  - title: One
    chapters:
      - id: ch01
        slug: a
        new:
          - x/a.py
        requires: cpu
      - id: ch02
        slug: b
        new: [x/b.py]
        modified:
          - x/a.py
        # a comment that stays
        requires: cpu
"""


def test_rewrite_list_touches_only_the_list_it_rewrites():
    added = rewrite_list(BLOCK, "ch01", "modified", ["x/c.py"])
    assert added == BLOCK.replace(
        "          - x/a.py\n        requires",
        "          - x/a.py\n        modified:\n          - x/c.py\n        requires",
        1,
    )
    emptied = rewrite_list(BLOCK, "ch02", "modified", [])
    assert emptied == BLOCK.replace("        modified:\n          - x/a.py\n", "")
    inline = rewrite_list(BLOCK, "ch02", "new", ["x/b.py", "x/d.py"])
    assert inline == BLOCK.replace("new: [x/b.py]", "new:\n          - x/b.py\n          - x/d.py")


def test_uncommitted_work_the_history_leaves_alone_is_kept(book, tmp_path):
    _git(book, "init", "-q")
    _git(book, "add", "--all")
    _git(book, "commit", "-qm", "book")
    history = _history(book, tmp_path / "history", "3")
    _replace(history / "python/toy/greet.py", "hello, ", "hi, ")
    _git(history, "commit", "-qa", "--amend", "--no-edit")
    (book / "tests/helpers.py").write_text("# work in progress\n", encoding="utf-8")
    done = steps(book, "import", str(history))
    assert done.returncode == 0, done.stderr
    assert "kept     tests/helpers.py" in done.stdout
    assert (book / "tests/helpers.py").read_text() == "# work in progress\n"
    assert "hi, " in (book / "python/toy/greet.py").read_text()
