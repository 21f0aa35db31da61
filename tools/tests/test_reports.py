"""What check and run tell a reader: the first failure whole, cuts marked, a command that re-runs
one test, skips counted, and run's verdict on a learner's tree."""

import re
import subprocess

import yaml
from bookmaker import steps, write_files
from stepslib.report import cut, failure_report, fold_library_frames

MARKER = re.compile(r"^\.\.\. ([\d,]+) characters cut \.\.\.$", re.MULTILINE)
BROKEN_COUNT = "def count(text: str) -> int:\n    return len(text)\n"
LONG_TESTS = """\
import pytest
from toy.count import count


def test_passes():
    assert count("") == 0


def test_first():
    print("\\n".join(f"line {i:05d} " + "x" * 80 for i in range(300)))
    assert count("one two three") == 3, "the bug is here"


@pytest.mark.parametrize("n", range(20))
def test_later(n):
    print("\\n".join("y" * 90 for _ in range(30)))
    assert count("a") == 100 + n, "a later failure"
"""


def _set(book, chapter_id, **fields):
    data = yaml.safe_load((book / "steps.yaml").read_text())
    for stage in data["stages"]:
        for entry in stage["chapters"]:
            if entry["id"] == chapter_id:
                entry.update(fields)
    (book / "steps.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def _learner(book, tmp_path, count_source=BROKEN_COUNT):
    learner = tmp_path / "learner"
    assert steps(book, "checkout", "3", str(learner)).returncode == 0
    (learner / "python/toy/count.py").write_text(count_source)
    return learner


def _rerun_command(stdout: str) -> str:
    lines = stdout.splitlines()
    return lines[lines.index(next(line for line in lines if line.endswith("by hand:"))) + 1]


# --- check --against: the first failure, the cuts, the headings, the re-run ---------------------


def test_the_first_failure_is_shown_whole_and_every_cut_is_marked(book, tmp_path):
    write_files(book, {"tests/test_ch03_count.py": LONG_TESTS})
    learner = _learner(book, tmp_path)
    done = steps(book, "check", "3", "--against", str(learner))
    assert done.returncode == 1
    out = done.stdout
    # the first failure's section, whole: header, where, the line, the assertion and its values
    first = out.index("_ test_first _")
    assert out[first:].splitlines()[1:6] == [
        "tests/test_ch03_count.py:11: in test_first",
        '    assert count("one two three") == 3, "the bug is here"',
        "E   AssertionError: the bug is here",
        "E   assert 13 == 3",
        "E    +  where 13 = count('one two three')",
    ]
    # the other failures (about 70,000 characters) and test_first's own prints are cut, marked
    assert len(MARKER.findall(out)) >= 2
    assert len(out) < 25_000
    for line in out.splitlines():  # each cut falls between lines: no line is shown in part
        if line.startswith("line "):
            assert re.fullmatch(r"line \d{5} x{80}", line), line
        if line.startswith("yy"):
            assert line == "y" * 90
    # the summary, whole, and the counts
    assert "FAILED tests/test_ch03_count.py::test_first - AssertionError: the bug is here" in out
    assert "FAILED tests/test_ch03_count.py::test_later[19]" in out
    assert "21 failed, 1 passed" in out


def test_each_detail_block_is_headed_with_what_it_is(book, tmp_path):
    learner = _learner(book, tmp_path)
    done = steps(book, "check", "3", "--against", str(learner))
    headings = [line for line in done.stdout.splitlines() if line.startswith("── ")]
    assert headings == [
        "── ch03_count · main: 1 line differs from main.out ──",
        "── ch03_count · tests: 1 failed ──",
    ]
    assert "-2\n+7\n" in done.stdout  # main's diff, under main's heading
    hint = next(line for line in done.stdout.splitlines() if line.startswith("see all it"))
    assert hint.endswith(f"steps.py --root {book} run ch03 --against {learner}")
    shown = subprocess.run(
        ["bash", "-c", hint.removeprefix("see all it prints: ")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 1 and "-2\n+7\n" in shown.stdout


def test_the_rerun_command_runs_the_first_failing_test_on_the_learners_tree(book, tmp_path):
    write_files(book, {"tests/test_ch03_count.py": LONG_TESTS})
    learner = _learner(book, tmp_path)
    done = steps(book, "check", "3", "--against", str(learner))
    command = _rerun_command(done.stdout).strip()
    assert command.startswith(
        f"cd {book}/.steps-cache/trees/ch03_count-yours && PYTHONPATH={learner}/python "
    )
    assert command.endswith(" -m pytest tests/test_ch03_count.py::test_first")
    again = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert again.returncode == 1
    assert "the bug is here" in again.stdout and "1 failed" in again.stdout
    (learner / "python/toy/count.py").write_text(  # the learner fixes the bug, runs it again
        "def count(text: str) -> int:\n    return len(text.split())\n"
    )
    again = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert again.returncode == 0 and "1 passed" in again.stdout


WRONG_TEST = "def test_wrong():\n    assert 1 == 2\n"


def test_the_books_own_failing_tree_is_kept_to_rerun_in_until_it_passes(book):
    good = (book / "tests/test_ch03_count.py").read_text()
    kept = book / ".steps-cache/trees/ch03_count"
    write_files(book, {"tests/test_ch03_count.py": WRONG_TEST})
    done = steps(book, "check", "3")
    command = _rerun_command(done.stdout).strip()
    assert command.startswith(f"cd {kept} && PYTHONPATH=python ")
    again = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert again.returncode == 1 and "1 failed" in again.stdout
    write_files(book, {"tests/test_ch03_count.py": good})
    assert steps(book, "check", "3").returncode == 0
    assert not kept.exists()


def test_a_pass_from_the_cache_clears_the_kept_tree_too(book):
    good = (book / "tests/test_ch03_count.py").read_text()
    kept = book / ".steps-cache/trees/ch03_count"
    assert steps(book, "check", "3").returncode == 0  # cached as passing
    write_files(book, {"tests/test_ch03_count.py": WRONG_TEST})
    assert steps(book, "check", "3").returncode == 1 and kept.exists()
    write_files(book, {"tests/test_ch03_count.py": good})
    assert "pass (cached)" in steps(book, "check", "3").stdout
    assert not kept.exists()


# --- library frames, folded: the E line near the top ------------------------------------------

DOCSTRING = "".join(f"    line {i:03d} of a library's long docstring\n" for i in range(400))
LIBRARY = f"""\
def from_pretrained(name):
    return _load(name)


def _load(name):
    \"\"\"Load a model.

{DOCSTRING}    \"\"\"
    raise ValueError("accelerate is required to load " + name)
"""
CALLS_LIBRARY = """\
import sys

sys.path.insert(0, {site!r})
import longlib


def test_loads():
    longlib.from_pretrained("the model")
"""


def test_a_librarys_frames_are_folded_and_its_error_is_near_the_top(book, tmp_path):
    site = tmp_path / "lib/python3.11/site-packages"
    write_files(site, {"longlib.py": LIBRARY})
    write_files(book, {"tests/test_ch03_count.py": CALLS_LIBRARY.format(site=str(site))})
    done = steps(book, "check", "3")
    assert done.returncode == 1
    out = done.stdout
    assert "long docstring" not in out and "def _load" not in out
    section = out[out.index("_ test_loads _") :].splitlines()
    assert section[1:5] == [
        "tests/test_ch03_count.py:8: in test_loads",
        '    longlib.from_pretrained("the model")',
        "... 2 frames in longlib folded, the last longlib.py:409 in _load",
        "E   ValueError: accelerate is required to load the model",
    ]
    assert len(out) < 3000


def test_folding_keeps_the_books_frames_and_names_each_library():
    report = (
        "tests/test_x.py:3: in test_x\n"
        "    engine.load(path)\n"
        "python/minisgl/engine.py:12: in load\n"
        "    model = AutoModel.from_pretrained(path)\n"
        "/v/lib/python3.11/site-packages/transformers/models/auto/auto_factory.py:564: in f\n"
        "    return model_class.from_pretrained(\n"
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "/v/lib/python3.11/site-packages/torch/nn/modules/module.py:9: in g\n"
        "    raise ValueError(\n"
        "E   ValueError: accelerate is required\n"
    )
    assert fold_library_frames(report) == (
        "tests/test_x.py:3: in test_x\n"
        "    engine.load(path)\n"
        "python/minisgl/engine.py:12: in load\n"
        "    model = AutoModel.from_pretrained(path)\n"
        "... 2 frames in transformers, torch folded, the last torch/nn/modules/module.py:9 in g\n"
        "E   ValueError: accelerate is required\n"
    )


def test_folding_reads_pythons_own_tracebacks_too():
    stderr = (
        "Traceback (most recent call last):\n"
        '  File "/tmp/steps-ch05-x/examples/ch05_kvcache.py", line 3, in <module>\n'
        "    json.loads(text)\n"
        '  File "/usr/lib/python3.12/json/__init__.py", line 346, in loads\n'
        "    return _default_decoder.decode(s)\n"
        '  File "<frozen importlib._bootstrap>", line 1204, in _gcd_import\n'
        "json.decoder.JSONDecodeError: Expecting value\n"
    )
    assert fold_library_frames(stderr) == (
        "Traceback (most recent call last):\n"
        '  File "/tmp/steps-ch05-x/examples/ch05_kvcache.py", line 3, in <module>\n'
        "    json.loads(text)\n"
        "  ... 2 frames in json, importlib._bootstrap folded, the last "
        "importlib._bootstrap:1204 in _gcd_import\n"
        "json.decoder.JSONDecodeError: Expecting value\n"
    )


# --- skips, counted -------------------------------------------------------------------------


SKIPPING_TESTS = """\
import pytest
from toy.count import count


def test_one():
    assert count("a") == 1


def test_two():
    assert count("a b") == 2


@pytest.mark.skipif(True, reason="needs a thing")
@pytest.mark.parametrize("n", [1, 2, 3])
def test_thing(n):
    pass


def test_inside():
    pytest.skip("not today")


@pytest.mark.xfail(reason="known")
def test_known():
    assert False
"""


def test_skipped_tests_are_counted_with_their_reasons(book):
    write_files(
        book,
        {
            "tests/test_ch03_count.py": SKIPPING_TESTS,
            "tests/test_ch03_more.py": "import pytest\n\n"
            'pytest.importorskip("no_such_module_here")\n\n\ndef test_x():\n    pass\n',
        },
    )
    _set(book, "ch03", tests=["tests/test_ch03_count.py", "tests/test_ch03_more.py"])
    for run in ("fresh", "cached"):
        done = steps(book, "check", "3")
        assert done.returncode == 0, done.stdout
        out = done.stdout
        assert ("(cached)" in out) == (run == "cached")
        row = out.splitlines()[2]
        assert "2 passed, 5 skipped, 1 xfailed" in row
        assert (
            "chapters: 1 passed, 0 failed, 0 skipped; their tests: 2 passed, 0 failed, "
            "5 skipped, 1 xfailed"
        ) in out
        reasons = out[out.index("tests skipped, by reason:") :].splitlines()[1:4]
        assert [line.split(None, 1) for line in reasons] == [
            ["3", "needs a thing"],
            ["1", "could not import 'no_such_module_here': No module named 'no_such_module_here'"],
            ["1", "not today"],
        ]


def test_a_learner_report_lists_each_skip_and_why(book, tmp_path):
    write_files(
        book,
        {
            "tests/test_ch03_count.py": SKIPPING_TESTS,
            "tests/test_ch03_more.py": "import pytest\n\n"
            'pytest.importorskip("no_such_module_here")\n',
        },
    )
    _set(book, "ch03", tests=["tests/test_ch03_count.py", "tests/test_ch03_more.py"])
    learner = _learner(
        book, tmp_path, "def count(text: str) -> int:\n    return len(text.split())\n"
    )
    done = steps(book, "check", "3", "--against", str(learner))
    assert done.returncode == 0, done.stdout
    assert "ch03 skipped tests/test_ch03_count.py::test_thing[2]  (needs a thing)" in done.stdout
    assert "ch03 xfailed tests/test_ch03_count.py::test_known  (known)" in done.stdout
    assert "ch03 passed  tests/test_ch03_count.py::test_one" in done.stdout
    assert (
        "ch03 skipped tests/test_ch03_more.py  (could not import 'no_such_module_here'"
        in done.stdout
    )  # a module skipped whole is named by its path


# --- run --against: a verdict against main.out -------------------------------------------


def test_run_against_says_the_same_when_the_prints_are_the_recorded_ones(book, tmp_path):
    learner = _learner(
        book, tmp_path, "def count(text: str) -> int:\n    return len(text.split())\n"
    )
    done = steps(book, "run", "3", "--against", str(learner))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == (
        "2\n\n── your tree prints what chapters/ch03_count/main.out holds, line for line ──\n"
    )


def test_run_against_shows_the_diff_when_they_differ(book, tmp_path):
    learner = _learner(book, tmp_path)
    done = steps(book, "run", "3", "--against", str(learner))
    assert done.returncode == 1
    assert done.stdout.startswith(
        "7\n\n── 1 line differs between your tree's prints and chapters/ch03_count/main.out ──\n"
    )
    assert (
        "--- chapters/ch03_count/main.out (recorded)\n"
        "+++ chapters/ch03_count/main.out (printed by your tree)\n"
    ) in done.stdout
    assert "-2\n+7\n" in done.stdout


def test_run_against_says_when_the_main_fails(book, tmp_path):
    learner = _learner(book, tmp_path, "def count(text):\n    raise ValueError('mine')\n")
    done = steps(book, "run", "3", "--against", str(learner))
    assert done.returncode == 1
    assert "ValueError: mine" in done.stderr
    assert "── examples/ch03_count.py exited with status 1 (its error is above) ──" in done.stdout


# --- the report's parts, on pytest's own kind of output --------------------------------------


def test_cut_keeps_whole_lines_and_counts_what_it_took():
    text = "".join(f"{i:04d} {'z' * 40}\n" for i in range(500))
    short = cut(text, 1000)
    assert len(short) <= 1000 + 40
    head, marker, tail = re.split(r"(\.\.\. [\d,]+ characters cut \.\.\.\n)", short)
    assert text.startswith(head) and text.endswith(tail) and head and tail
    assert all(re.fullmatch(r"\d{4} z{40}", line) for line in (head + tail).splitlines())
    taken = int(MARKER.search(marker).group(1).replace(",", ""))
    assert len(head) + taken + len(tail) == len(text)
    assert cut("short\n", 1000) == "short\n"


PYTEST_OUTPUT = """\
.E.F                                                                 [100%]
==================================== ERRORS ====================================
__________________________ ERROR at setup of test_late __________________________
E   fixture 'nothing' not found
============================== FAILURES ===============================
_______________________________ test_early ________________________________

    def test_early():
>       assert f() == 1
E       assert 2 == 1

tests/test_x.py:4: AssertionError
----------------------------- Captured stdout call -----------------------------
==== a rule the test printed ====
CAPTURED
=========================== short test summary info ============================
FAILED tests/test_x.py::test_early - assert 2 == 1
ERROR tests/test_x.py::test_late
1 failed, 2 passed, 1 error in 0.10s
"""


def test_the_first_failure_is_the_first_that_ran_and_its_captured_output_is_cut():
    captured = "\n".join(f"print {i:04d}" for i in range(2000))
    output = PYTEST_OUTPUT.replace("CAPTURED", captured)
    report, node = failure_report(
        output, ["tests/test_x.py::test_early", "tests/test_x.py::test_late"]
    )
    assert node == "tests/test_x.py::test_early"
    assert "    def test_early():\n>       assert f() == 1\nE       assert 2 == 1\n" in report
    assert "print 1999\n" in report and "print 1000\n" not in report
    assert len(MARKER.findall(report)) == 1
    assert report.endswith(
        "ERROR tests/test_x.py::test_late\n1 failed, 2 passed, 1 error in 0.10s\n"
    )


def test_a_rule_a_test_prints_ends_no_section():
    output = PYTEST_OUTPUT.replace(
        "CAPTURED", "printed\n" + "_" * 20 + " test_later " + "_" * 20 + "\nE   the later one"
    )
    report, node = failure_report(output, ["tests/test_x.py::test_later"])
    assert node == "tests/test_x.py::test_later"  # found: a failure's section after the rule
    assert " test_later " + "_" * 20 + "\nE   the later one\n" in report


def test_a_collection_error_is_the_first_failure_of_its_module():
    output = (
        "E\n==== ERRORS ====\n____ ERROR collecting tests/test_y.py ____\n"
        "ImportError: no module named nowhere\n==== short test summary info ====\n"
        "ERROR tests/test_y.py\n1 error in 0.1s\n"
    )
    report, node = failure_report(output, ["tests/test_y.py"])
    assert node == "tests/test_y.py" and "ImportError: no module named nowhere" in report


def test_output_without_sections_is_cut_from_both_ends():
    output = "INTERNALERROR> start\n" + "INTERNALERROR> more\n" * 2000 + "the end\n"
    report, node = failure_report(output, [])
    assert node is None
    assert report.startswith("INTERNALERROR> start\n") and report.endswith("the end\n")
    assert len(MARKER.findall(report)) == 1
