"""list, tree, checkout, diff, run, record, matrix and render on the toy book."""

import json
import os
import subprocess
import sys

import git
from bookmaker import steps, write_files


def test_list_has_a_row_per_chapter(book):
    done = steps(book, "list")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0].split() == [
        "stage",
        "id",
        "title",
        "files",
        "new",
        "modified",
        "early",
        "requires",
    ]
    assert lines[2].split() == ["Stage", "1", "ch02", "Chapter", "2", "4", "1", "1", "1", "cpu"]
    assert len(lines) == 4


def test_tree_marks_new_modified_and_early(book):
    done = steps(book, "tree", "ch02")
    assert done.stdout.splitlines() == [
        "Files so far: 4 (1 new, 1 modified, 1 brought in early)",
        "",
        "toy/",
        "├── __init__.py",
        "├── greet.py  ← modified in this chapter",
        "├── shout.py  ← new in this chapter",
        "├── count.py  ← brought in early",
    ]
    # its own chapter still counts it as new
    assert steps(book, "tree", "3").stdout.startswith("Files so far: 4 (1 new, 0 modified, 0")


def test_checkout_writes_each_chapters_versions(book, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert steps(book, "checkout", "1", str(one)).returncode == 0
    assert steps(book, "checkout", "ch02", str(two)).returncode == 0
    assert '"hello " + name' in (one / "python/toy/greet.py").read_text()
    assert '"hello, " + name' in (two / "python/toy/greet.py").read_text()
    assert not (one / "python/toy/count.py").exists()
    assert (two / "python/toy/count.py").exists()  # brought in early
    assert (two / "tests/helpers.py").exists()  # support files are in every tree
    assert (two / "examples/ch01_greet.py").exists()
    assert not (two / "examples/ch03_count.py").exists()
    env = dict(os.environ, PYTHONPATH=str(two / "python"))
    ran = subprocess.run(
        [sys.executable, "examples/ch02_shout.py"], cwd=two, env=env, capture_output=True, text=True
    )
    assert ran.stdout == "HELLO, WORLD!\n3\n"


def test_checkout_refuses_a_non_empty_dest_unless_forced(book, tmp_path, unchanged):
    dest = tmp_path / "dest"
    write_files(dest, {"keep.txt": "mine\n"})
    guard = unchanged(tmp_path)
    done = steps(book, "checkout", "2", str(dest))
    assert done.returncode == 2
    assert "is not empty" in done.stderr and str(dest) in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    guard.check()
    sibling = tmp_path / "sibling.txt"
    sibling.write_text("outside\n")
    assert steps(book, "checkout", "2", str(dest), "--force").returncode == 0
    assert not (dest / "keep.txt").exists()
    assert (dest / "python/toy/shout.py").exists()
    assert sibling.read_text() == "outside\n"  # nothing outside DEST is touched


def test_checkout_refuses_the_book_itself_and_a_file(book, tmp_path, unchanged):
    guard = unchanged(book)
    assert steps(book, "checkout", "1", str(book), "--force").returncode == 2
    assert steps(book, "checkout", "1", str(book.parent), "--force").returncode == 2
    guard.check()
    target = tmp_path / "a-file"
    target.write_text("x")
    done = steps(book, "checkout", "1", str(target), "--force")
    assert done.returncode == 2 and "not a folder" in done.stderr
    assert target.read_text() == "x"


def test_checkout_git_has_a_commit_and_tag_per_chapter(book, tmp_path):
    dest = tmp_path / "repo"
    done = steps(book, "checkout", "3", str(dest), "--git")
    assert done.returncode == 0, done.stderr
    repo = git.Repo(dest)
    assert sorted(t.name for t in repo.tags) == ["ch01", "ch02", "ch03"]
    assert [c.message.strip() for c in repo.iter_commits()] == [
        "ch03: Chapter 3",
        "ch02: Chapter 2",
        "ch01: Chapter 1",
    ]
    changed = repo.git.diff("ch01", "ch02", "--name-only").split()
    assert changed == [
        "examples/ch02_shout.py",
        "python/toy/count.py",
        "python/toy/greet.py",
        "python/toy/shout.py",
        "tests/test_ch02_shout.py",
    ]
    # `git diff ch01 ch02` is exactly the tool's diff of chapter 2
    ours = steps(book, "diff", "2").stdout
    for path in changed:
        assert f"b/{path}" in ours
    assert repo.git.show("ch01:python/toy/greet.py").endswith('"hello " + name')
    assert not repo.is_dirty(untracked_files=True)


def test_checkout_git_is_reproducible(book, tmp_path):
    heads = []
    for name in ("a", "b"):
        assert steps(book, "checkout", "2", str(tmp_path / name), "--git").returncode == 0
        heads.append(git.Repo(tmp_path / name).head.commit.hexsha)
    assert heads[0] == heads[1]


def test_diff_of_the_first_chapter_adds_everything(book):
    text = steps(book, "diff", "1").stdout
    assert "+++ b/python/toy/greet.py" in text and "--- /dev/null" in text
    assert "+++ b/tests/helpers.py" in text
    assert "shout" not in text


def test_run_shows_the_main_output(book):
    done = steps(book, "run", "2")
    assert done.returncode == 0
    assert done.stdout == "HELLO, WORLD!\n3\n"


def test_run_against_a_learners_tree(book, tmp_path):
    learner = tmp_path / "learner"
    assert steps(book, "checkout", "2", str(learner)).returncode == 0
    (learner / "python/toy/shout.py").write_text(
        "def shout(name):\n    return 'HEY ' + name.upper()\n"
    )
    done = steps(book, "run", "2", "--against", str(learner))
    assert done.stdout.startswith("HEY WORLD\n3\n\n── 1 line differs")  # then the verdict
    assert done.returncode == 1


def test_record_rewrites_the_prints_and_shows_the_diff(book):
    (book / "examples/ch03_count.py").write_text(
        "from toy.count import count\n\nprint(count('one two three'))\n"
    )
    done = steps(book, "record", "3")
    assert done.returncode == 0
    assert "-2\n+3\n" in done.stdout
    assert (book / "chapters/ch03_count/main.out").read_text() == "3\n"
    assert not list(book.glob("chapters/ch03_count/*.part"))
    assert "unchanged" in steps(book, "record", "3").stdout


def test_record_keeps_the_prints_when_the_main_fails(book, unchanged):
    (book / "examples/ch03_count.py").write_text("raise SystemExit('broken main')\n")
    guard = unchanged(book)
    done = steps(book, "record", "ch03")
    assert done.returncode == 1
    assert "not recorded" in done.stdout and "broken main" in done.stdout
    guard.check()


def test_matrix_lists_every_chapter(book):
    matrix = json.loads(steps(book, "matrix").stdout)
    assert [(e["chapter"], e["requires"]) for e in matrix["include"]] == [
        ("ch01", "cpu"),
        ("ch02", "cpu"),
        ("ch03", "cpu"),
    ]


def test_matrix_changed_since_lists_only_the_affected_chapters(book):
    repo = git.Repo.init(book)
    repo.git.add("--all")
    repo.git.commit(
        "-qm",
        "book",
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        },
    )

    def affected() -> list[str]:
        done = steps(book, "matrix", "--changed-since", "HEAD")
        return [e["chapter"] for e in json.loads(done.stdout)["include"]]

    assert affected() == []
    (book / "python/toy/count.py").write_text("def count(text):\n    return 0\n")
    assert affected() == ["ch02", "ch03"]  # brought in early by ch02
    repo.git.checkout("--", ".")
    (book / "chapters/ch01_greet/python/toy/greet.py").write_text("def greet(n):\n    return n\n")
    assert affected() == ["ch01"]
    repo.git.checkout("--", ".")
    (book / "chapters/ch02_shout/README.md").write_text("# Shout, again\n")
    assert affected() == ["ch02"]
    (book / "tests/helpers.py").write_text("def words(t):\n    return t.split()\n")
    assert affected() == ["ch01", "ch02", "ch03"]


def test_matrix_with_an_unknown_ref_is_bad_input(book):
    git.Repo.init(book)
    done = steps(book, "matrix", "--changed-since", "no-such-ref")
    assert done.returncode == 2 and "no-such-ref" in done.stderr


def test_render_expands_directives_from_the_chapters_own_version(book, tmp_path):
    out = tmp_path / "pages"
    done = steps(book, "render", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "ch01_greet.md",
        "ch02_shout.md",
        "ch03_count.md",
        "index.md",
    ]
    one = (out / "ch01_greet.md").read_text()
    assert "**`toy/greet.py · greet`**\n\n```python\ndef greet" in one
    assert '"hello " + name' in one  # chapter 1's version, not the newest
    assert "Files so far: 2 (2 new, 0 modified, 0 brought in early)" in one
    assert "```text\nhello world\n```" in one
    assert "print(greet('world'))" in one
    two = (out / "ch02_shout.md").read_text()
    assert '"hello, " + name' in two
    assert "def test_shout():" in two
    assert "@[" not in one + two
    index = (out / "index.md").read_text()
    assert "## Stage 2" in index and "3. [Chapter 3](ch03_count.md)" in index
