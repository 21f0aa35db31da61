"""check: prints, tests, imports, texts, the cache, learners' trees, skips, junit."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import yaml
from bookmaker import STEPS, steps, write_files
from stepslib import installed
from stepslib.book import load_book
from stepslib.render import render_chapter


def _set(book, chapter_id, **fields):
    """Change one chapter's entry in the toy book's steps.yaml."""
    data = yaml.safe_load((book / "steps.yaml").read_text())
    for stage in data["stages"]:
        for entry in stage["chapters"]:
            if entry["id"] == chapter_id:
                entry.update(fields)
    (book / "steps.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def test_a_correct_book_passes_and_is_then_cached(book):
    first = steps(book, "check")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "3 passed, 0 failed, 0 skipped" in first.stdout
    second = steps(book, "check")
    assert second.stdout.count("pass (cached)") == 3


def test_editing_one_file_reruns_only_the_chapters_that_depend_on_it(book):
    assert steps(book, "check").returncode == 0
    (book / "chapters/ch01_greet/python/toy/greet.py").write_text(
        'def greet(name: str) -> str:\n    return "hello " + name  # edited\n'
    )
    rows = {line.split()[0]: line for line in steps(book, "check").stdout.splitlines()[2:5]}
    assert "(cached)" not in rows["ch01"]
    assert "(cached)" in rows["ch02"] and "(cached)" in rows["ch03"]


def test_no_cache_reruns_everything(book):
    assert steps(book, "check").returncode == 0
    assert "(cached)" not in steps(book, "check", "--no-cache").stdout


def test_a_changed_print_fails_with_a_diff(book):
    (book / "chapters/ch02_shout/main.out").write_text("HELLO, WORLD\n3\n")
    done = steps(book, "check", "2")
    assert done.returncode == 1
    assert "differs" in done.stdout
    assert "-HELLO, WORLD\n+HELLO, WORLD!\n" in done.stdout


def test_a_failing_test_fails_with_its_output(book):
    write_files(
        book,
        {"tests/test_ch03_count.py": "def test_wrong():\n    assert 1 + 1 == 3, 'arithmetic'\n"},
    )
    done = steps(book, "check", "3")
    assert done.returncode == 1
    assert "1 failed" in done.stdout and "arithmetic" in done.stdout


def test_a_tests_file_that_collects_nothing_is_a_failure(book):
    write_files(book, {"tests/test_ch03_count.py": "x = 1\n"})
    done = steps(book, "check", "3")
    assert done.returncode == 1
    assert "collected no test" in done.stdout


def test_a_broken_import_is_reported_where_it_is(book):
    write_files(
        book,
        {
            "python/toy/shout.py": "from toy.greet import greeting\n\n\ndef shout(name):\n"
            "    from toy.missing import thing\n    return name\n"
        },
    )
    done = steps(book, "check", "2", "--static")
    assert done.returncode == 1
    assert (
        "python/toy/shout.py:1: `from toy.greet import greeting`: toy.greet has no name "
        "'greeting'" in done.stdout
    )
    assert (
        "python/toy/shout.py:5: `from toy.missing import thing`: no module toy.missing"
        in done.stdout
    )


def test_a_main_may_not_import_a_later_chapters_module(book):
    write_files(
        book,
        {"examples/ch01_greet.py": "from toy.greet import greet\nfrom toy.shout import shout\n"},
    )
    done = steps(book, "check", "1", "--static")
    assert done.returncode == 1
    assert (
        "examples/ch01_greet.py:2: `from toy.shout import shout`: no module toy.shout"
        in done.stdout
    )


def test_a_marked_forward_reference_is_allowed_until_its_chapter_and_listed(book):
    greet = (book / "chapters/ch01_greet/python/toy/greet.py").read_text()
    write_files(
        book,
        {
            "chapters/ch01_greet/python/toy/greet.py": greet
            + "\n\ndef later():\n    from toy.shout import shout  "
            "# forward reference: ch02\n    return shout\n"
        },
    )
    done = steps(book, "check", "1", "--static")
    assert done.returncode == 0, done.stdout
    assert "forward references" in done.stdout
    assert "chapters/ch01_greet/python/toy/greet.py:6: toy.shout (ch02)" in done.stdout


def test_a_forward_reference_must_resolve_from_its_chapter_on(book):
    shout = (book / "python/toy/shout.py").read_text()
    write_files(
        book,
        {
            "python/toy/shout.py": shout + "\n\ndef later():\n"
            "    from toy.nothing import x  # forward reference: ch02\n"
        },
    )
    done = steps(book, "check", "2", "--static")
    assert done.returncode == 1
    assert "no module toy.nothing" in done.stdout


def test_an_unresolved_text_reference_fails(book):
    write_files(
        book,
        {
            "chapters/ch01_greet/README.md": "# Greet\n\n@[code](toy/greet.py · nothing)\n\n"
            "@[code](toy/shout.py)\n\n@[bogus]\n"
        },
    )
    done = steps(book, "check", "1", "--static")
    assert done.returncode == 1
    assert "chapters/ch01_greet/README.md:3: toy/greet.py has no nothing" in done.stdout
    assert "chapters/ch01_greet/README.md:5: toy/shout.py is not in the tree at ch01" in done.stdout
    assert "README.md:7: unknown directive @[bogus]" in done.stdout


def test_code_shows_a_repository_file_that_no_tree_holds(book):
    """A benchmark script is the repository's own: @[code] takes it as it is, by symbol, and
    the rendered text is its source; a tree's file stays bound to its chapter."""
    timed = "async def timed(n: int) -> float:\n    return n * 0.5\n"
    write_files(
        book,
        {
            "benchmark/bench.py": f"import time\n\n\n{timed}\n\nSIZES = (1, 2)\n",
            "chapters/ch01_greet/README.md": "# Greet\n\ntoy/__init__.py, toy/greet.py.\n\n"
            "@[code](benchmark/bench.py · timed)\n\n@[code](benchmark/bench.py · SIZES)\n",
        },
    )
    done = steps(book, "check", "1", "--static")
    assert done.returncode == 0, done.stdout
    page = render_chapter(load_book(book), load_book(book).chapter(1))
    assert f"**`benchmark/bench.py · timed`**\n\n```python\n{timed}```" in page
    assert "```python\nSIZES = (1, 2)\n```" in page

    write_files(
        book,
        {
            "chapters/ch01_greet/README.md": "# Greet\n\n@[code](benchmark/bench.py · slow)\n\n"
            "@[code](benchmark/none.py · f)\n\n@[code](examples/ch03_count.py)\n\n"
            "@[code](chapters/ch01_greet/python/toy/greet.py)\n"
        },
    )
    done = steps(book, "check", "1", "--static")
    assert done.returncode == 1
    out = done.stdout
    assert "README.md:3: benchmark/bench.py has no slow" in out
    assert "README.md:5: benchmark/none.py is not in the tree at ch01" in out
    assert "README.md:7: examples/ch03_count.py is not in the tree at ch01" in out  # ch03's main
    # a stored version is shown through the tree that holds it, never by its own path
    assert "README.md:9: chapters/ch01_greet/python/toy/greet.py is not in the tree" in out


def test_static_runs_nothing(book):
    (book / "chapters/ch02_shout/main.out").write_text("wrong\n")
    done = steps(book, "check", "--static")
    assert done.returncode == 0
    assert "3 passed" in done.stdout


def test_cumulative_runs_every_test_up_to_the_chapter(book):
    done = steps(book, "check", "3", "--cumulative")
    assert done.returncode == 0, done.stdout
    assert "3 passed" in done.stdout.splitlines()[2]  # three tests in chapter 3's row


def test_chapter_selection_forms(book):
    assert "ch02" in steps(book, "check", "ch02-ch03", "--static").stdout
    rows = steps(book, "check", "1,3", "--static").stdout.splitlines()[2:4]
    assert [r.split()[0] for r in rows] == ["ch01", "ch03"]


def test_a_gpu_chapter_is_skipped_without_a_gpu(book):
    _set(book, "ch03", requires="gpu")
    done = steps(book, "check", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skipped: needs a GPU" in done.stdout
    assert "0 passed, 0 failed, 1 skipped" in done.stdout


def test_a_missing_module_need_is_a_skip_not_a_failure(book):
    _set(book, "ch03", needs=["no_such_module_here"])
    done = steps(book, "check", "3")
    assert done.returncode == 0
    assert "skipped: needs no_such_module_here" in done.stdout


def test_no_skip_fails_a_cpu_chapter_whose_needs_are_missing(book):
    _set(book, "ch03", needs=["no_such_module_here"])
    done = steps(book, "check", "3", "--no-skip")
    assert done.returncode == 1, done.stdout
    assert "needs no_such_module_here, not installed" in done.stdout + done.stderr
    _set(book, "ch03", needs=[], requires="gpu")  # no GPU here: still a skip, not a failure
    assert steps(book, "check", "3", "--no-skip").returncode == 0


def test_a_tolerance_compares_numbers_within_it(book):
    write_files(
        book,
        {
            "examples/ch03_count.py": "print(f'max error {2.4e-07:.1e}')\n",
            "chapters/ch03_count/main.out": "max error 3.1e-07\n",
            "chapters/ch03_count/README.md": "# Count\n\n`toy/count.py` counts.\n",
        },
    )
    assert steps(book, "check", "3").returncode == 1
    _set(book, "ch03", tolerance=1.0e-6)
    assert steps(book, "check", "3").returncode == 0
    write_files(book, {"chapters/ch03_count/main.out": "max error 3.1e-05\n"})
    assert steps(book, "check", "3").returncode == 1
    write_files(book, {"chapters/ch03_count/main.out": "max eror 2.4e-07\n"})
    assert steps(book, "check", "3").returncode == 1  # the words still have to match


def test_junit_report(book, tmp_path):
    write_files(
        book,
        {
            "tests/test_ch03_count.py": "def test_a():\n    pass\n\n\n"
            "def test_b():\n    assert False\n"
        },
    )
    report = tmp_path / "out/junit.xml"
    assert steps(book, "check", "--junit", str(report)).returncode == 1
    suites = ET.parse(report).getroot()
    names = [s.get("name") for s in suites]
    assert names == ["ch01_greet", "ch02_shout", "ch03_count"]
    ch03 = suites[2]
    failed = [c.get("name") for c in ch03 if c.find("failure") is not None]
    assert any("test_b" in name for name in failed) and "tests" in failed
    assert not any("test_a" in name for name in failed)


def test_learner_tree_that_matches_passes(book, tmp_path):
    learner = tmp_path / "learner"
    assert steps(book, "checkout", "3", str(learner)).returncode == 0
    done = steps(book, "check", "2", "--against", str(learner))
    assert done.returncode == 0, done.stdout
    assert "your tree, item by item" in done.stdout
    assert "ch02 passed  tests/test_ch02_shout.py::test_shout" in done.stdout


def test_learner_tree_with_a_bug_gets_a_per_item_report(book, tmp_path):
    learner = tmp_path / "learner"
    assert steps(book, "checkout", "3", str(learner)).returncode == 0
    (learner / "python/toy/shout.py").write_text("def shout(name):\n    return name\n")
    done = steps(book, "check", "2", "--against", str(learner))
    assert done.returncode == 1
    assert "ch02 main: differs" in done.stdout
    assert "ch02 failed  tests/test_ch02_shout.py::test_shout" in done.stdout


def test_learner_tree_that_does_not_import_is_bad_input(book, tmp_path):
    learner = tmp_path / "learner"
    write_files(learner, {"python/toy/__init__.py": "import nowhere_to_be_found\n"})
    done = steps(book, "check", "2", "--against", str(learner))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "does not import" in lines[0] and "nowhere_to_be_found" in lines[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    done = steps(book, "check", "--against", str(empty))
    assert done.returncode == 2 and "python/toy" in done.stderr


# --- a package that changes while check runs ---------------------------------------------------

INSTALLS_WHILE_RUNNING = """\
from pathlib import Path


def test_installs_an_extra():
    (Path({site!r}) / "accelerate-1.2.1.dist-info").mkdir()
    assert False, "failed after an install"
"""


def test_a_package_installed_while_check_ran_is_named_in_the_report(book, tmp_path):
    site = tmp_path / "lib/site-packages"
    (site / "numpy-2.1.0.dist-info").mkdir(parents=True)
    write_files(book, {"tests/test_ch03_count.py": INSTALLS_WHILE_RUNNING.format(site=str(site))})
    done = subprocess.run(
        [sys.executable, str(STEPS), "--root", str(book), "check", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(site)},  # a site folder on the tool's sys.path
    )
    assert done.returncode == 1
    note = (
        "note: while check ran, accelerate 1.2.1 was installed.\n"
        "A failure may come from that change, not from the book: re-run check."
    )
    assert note in done.stdout
    assert done.stdout.index(note) < done.stdout.index("failed after an install")
    assert "numpy" not in done.stdout  # there before and after: not a change


def test_no_note_when_nothing_changed(book):
    write_files(book, {"tests/test_ch03_count.py": "def test_wrong():\n    assert 1 == 2\n"})
    done = steps(book, "check", "3")
    assert done.returncode == 1 and "note:" not in done.stdout


def test_each_kind_of_change_is_told():
    before = {
        "/v/site-packages/torch-2.5.0.dist-info": 1,
        "/v/site-packages/numpy-2.1.0.dist-info": 1,
        "/v/site-packages/old_thing-1.0.dist-info": 1,
        "/v/site-packages/typing_extensions-4.12.0.dist-info": 1,
        "/v/site-packages/accelerate-1.15.0.dist-info": 1,
    }
    after = {
        "/v/site-packages/torch-2.5.1.dist-info": 2,
        "/v/site-packages/numpy-2.1.0.dist-info": 2,
        "/u/site-packages/accelerate-1.2.1.dist-info": 2,  # one more, in another site folder
        "/v/site-packages/typing_extensions-4.12.0.dist-info": 1,
        "/v/site-packages/accelerate-1.15.0.dist-info": 1,
    }
    assert installed.changes(before, after) == [
        "accelerate 1.2.1 was installed",
        "numpy 2.1.0 was reinstalled",
        "old-thing 1.0 was removed",
        "torch 2.5.0 was replaced by 2.5.1",
    ]
    assert installed.note(after, after) == ""


def test_a_snapshot_holds_each_distributions_metadata_folder(tmp_path):
    (tmp_path / "torch-2.5.0.dist-info").mkdir()
    (tmp_path / "torch").mkdir()
    (tmp_path / "README.txt").write_text("not a package\n")
    found = installed.snapshot([tmp_path, tmp_path / "missing"])
    assert list(found) == [str(tmp_path / "torch-2.5.0.dist-info")]


def test_a_text_that_never_names_a_changed_file_fails(book):
    text = book / "chapters/ch02_shout/README.md"
    named = text.read_text()
    assert "shout.py" in named  # the toy chapter names the file it adds
    text.write_text(named.replace("@[code](toy/shout.py)", "A new module shouts."))
    done = steps(book, "check", "2", "--static")
    assert done.returncode == 1
    assert "adds toy/shout.py but its text never names it" in done.stdout
