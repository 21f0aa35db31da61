"""Bad input: one clear line saying what and where, exit status 2, nothing written."""

import pytest
import yaml
from bookmaker import steps, write_files


def _yaml(book) -> dict:
    return yaml.safe_load((book / "steps.yaml").read_text())


def _write_yaml(book, data: dict) -> None:
    (book / "steps.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def _chapter(data: dict, chapter_id: str) -> dict:
    return next(c for s in data["stages"] for c in s["chapters"] if c["id"] == chapter_id)


def _refused(book, unchanged, *args: str) -> str:
    guard = unchanged(book)
    done = steps(book, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert done.stdout == ""
    guard.check()
    return lines[0]


def test_yaml_syntax_error_names_the_line(book, unchanged):
    text = (book / "steps.yaml").read_text().replace("slug: shout", "slug: [shout", 1)
    (book / "steps.yaml").write_text(text)
    line = _refused(book, unchanged, "check")
    number = text.splitlines().index("    slug: [shout") + 1
    assert "steps.yaml:" in line and "not valid YAML" in line
    assert int(line.split("steps.yaml:")[1].split(":")[0]) in (number, number + 1)


def test_unknown_key_names_its_line(book, unchanged):
    text = (
        (book / "steps.yaml")
        .read_text()
        .replace("    slug: count\n", "    slug: count\n    slag: x\n")
    )
    (book / "steps.yaml").write_text(text)
    number = text.splitlines().index("    slag: x") + 1
    assert (
        _refused(book, unchanged, "list")
        == f"steps.py: error: steps.yaml:{number}: unknown key 'slag' in a chapter"
    )


def test_duplicate_key(book, unchanged):
    text = (
        (book / "steps.yaml")
        .read_text()
        .replace("    slug: count\n", "    slug: count\n    slug: again\n")
    )
    (book / "steps.yaml").write_text(text)
    assert "key 'slug' appears twice" in _refused(book, unchanged, "list")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: _chapter(d, "ch02").pop("main"), "missing key 'main'"),
        (
            lambda d: _chapter(d, "ch02").update(main="examples/nope.py"),
            "ch02: examples/nope.py does not exist",
        ),
        (
            lambda d: _chapter(d, "ch02").update(tests=["tests/nope.py"]),
            "ch02: tests/nope.py does not exist",
        ),
        (
            lambda d: _chapter(d, "ch03").update(new=["toy/count.py", "toy/greet.py"]),
            "toy/greet.py is claimed twice: new in ch01 and ch03",
        ),
        (
            lambda d: _chapter(d, "ch01").update(modified=["toy/shout.py"]),
            "ch01 modifies toy/shout.py, which no earlier chapter adds",
        ),
        (
            lambda d: _chapter(d, "ch02").update(early=["toy/nothing.py"]),
            "ch02 brings in toy/nothing.py early, but no chapter adds it",
        ),
        (
            lambda d: _chapter(d, "ch02").update(early=["toy/greet.py"]),
            "ch02 brings in toy/greet.py early, but ch01 adds it already",
        ),
        (lambda d: _chapter(d, "ch03").update(id="ch02"), "chapter id ch02 is used twice"),
        (lambda d: _chapter(d, "ch03").update(id="ch01x"), "is not of the form ch01"),
        (lambda d: _chapter(d, "ch03").update(requires="tpu"), "requires must be cpu or gpu"),
        (lambda d: _chapter(d, "ch03").update(new="toy/count.py"), "'new' has the wrong type"),
        (
            lambda d: d.update(support=["tests/gone.py"]),
            "support file tests/gone.py does not exist",
        ),
    ],
)
def test_inconsistent_book(book, unchanged, edit, message):
    data = _yaml(book)
    edit(data)
    _write_yaml(book, data)
    line = _refused(book, unchanged, "check")
    assert message in line
    assert "steps.yaml" in line


def test_chapters_out_of_order(book, unchanged):
    data = _yaml(book)
    data["stages"].reverse()
    _write_yaml(book, data)
    assert "ch01 comes after ch03: ids must be in order" in _refused(book, unchanged, "list")


def test_a_missing_superseded_version(book, unchanged):
    (book / "chapters/ch01_greet/python/toy/greet.py").unlink()
    line = _refused(book, unchanged, "tree", "1")
    assert "the superseded version of toy/greet.py from ch01 is missing" in line
    assert "chapters/ch01_greet/python/toy/greet.py" in line


def test_a_missing_newest_version(book, unchanged):
    (book / "python/toy/shout.py").unlink()
    assert "the newest version of toy/shout.py from ch02 is missing" in _refused(
        book, unchanged, "list"
    )


def test_an_orphaned_stored_version(book, unchanged):
    write_files(book, {"chapters/ch02_shout/python/toy/shout.py": "old\n"})
    line = _refused(book, unchanged, "list")
    assert line.startswith("steps.py: error: chapters/ch02_shout/python/toy/shout.py:")
    assert "orphaned" in line


def test_a_package_file_no_chapter_adds(book, unchanged):
    write_files(book, {"python/toy/stray.py": "\n"})
    assert "python/toy/stray.py: no chapter of steps.yaml writes this file" in _refused(
        book, unchanged, "list"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (("tree", "9"), "no chapter 9 in the book (chapters: ch01, ch02, ch03)"),
        (("tree", "chapter-two"), "not a chapter or a range"),
        (("tree", "ch02_greet"), "not a chapter or a range: 'ch02_greet'"),  # ch02 is shout
        (("check", "3-1"), "the range '3-1' runs backwards"),
        (("check", "1,7"), "no chapter 7"),
        (("tree", "1-3"), "name one chapter"),
        (("frobnicate",), "invalid choice: 'frobnicate'"),
        (("tree",), "the following arguments are required: chapter"),
    ],
)
def test_bad_command_lines(book, unchanged, args, message):
    assert message in _refused(book, unchanged, *args)


def test_bad_input_wins_over_failures(book, unchanged):
    (book / "chapters/ch01_greet/main.out").write_text("wrong\n")
    assert "no chapter 8" in _refused(book, unchanged, "check", "1,8")


def test_a_folder_that_is_no_book(tmp_path, unchanged):
    done = steps(tmp_path, "list")
    assert done.returncode == 2
    assert done.stderr.strip() == f"steps.py: error: no steps.yaml in {tmp_path}"
