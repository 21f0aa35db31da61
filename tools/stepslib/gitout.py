"""`checkout --git`: the trees of chapters 1..N as one commit each, tagged chNN.

Author, committer and dates are fixed, so the same book gives the same commits.
"""

from __future__ import annotations

from pathlib import Path

from .book import Book, Chapter
from .tree import tree_at, write_tree

AUTHOR = ("mini-sglang from Scratch", "book@minisgl.invalid")
EPOCH = 1_767_225_600  # 2026-01-01T00:00:00Z; chapter k is committed k hours later


def checkout_git(book: Book, chapter: Chapter, dest: Path) -> None:
    import git  # GitPython; imported here because it is slow to import and only used here

    repo = git.Repo.init(dest, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", AUTHOR[0])
        config.set_value("user", "email", AUTHOR[1])
    previous: set[str] = set()
    for step in book.upto(chapter):
        tree = tree_at(book, step)
        for gone in previous - tree.keys():
            (dest / gone).unlink()
        write_tree(tree, dest)
        previous = set(tree)
        repo.git.add("--all")
        date = f"{EPOCH + 3600 * step.number} +0000"
        repo.git.commit(
            "--allow-empty",
            "-q",
            "-m",
            f"{step.id}: {step.title}",
            env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date},
        )
        repo.create_tag(step.id)
    repo.close()
