"""practice/: the runner (shared with the browser), judge.py's command line and the checks
`steps.py check` makes of an exercise. The command line runs on a copy of practice/ in a
temporary folder, so no working copy is ever written into the repository."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRACTICE = REPO / "practice"
EXAMPLE = "171_graph_padding"


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


runner = _module("practice_runner_under_test", PRACTICE / "runner.py")
judge = _module("practice_judge_under_test", PRACTICE / "judge.py")

TESTS = """
def helper():
    return 1

def test_adds(solution):
    assert solution.add(2, 3) == 5, f"add(2, 3) should be 5, not {solution.add(2, 3)}"

def test_negative(solution):
    assert solution.add(-1, -1) == -2

def test_zero(solution):
    assert solution.add(0, 0) == 0, "add(0, 0) should be 0"
"""
GOOD = "def add(a, b):\n    return a + b\n"


def _names(outcomes) -> list[tuple[str, bool]]:
    return [(o.name, o.passed) for o in outcomes]


# --- the runner -------------------------------------------------------------------------------


def test_a_right_solution_passes_every_test_in_order() -> None:
    outcomes = runner.run(GOOD, TESTS)
    assert _names(outcomes) == [("test_adds", True), ("test_negative", True), ("test_zero", True)]
    assert runner.report(outcomes)[-1] == "PASSED: all 3 tests"
    assert runner.all_passed(outcomes)


def test_a_wrong_solution_fails_with_the_tests_message() -> None:
    outcomes = runner.run("def add(a, b):\n    return a - b\n", TESTS)
    assert _names(outcomes) == [("test_adds", False), ("test_negative", False), ("test_zero", True)]
    assert outcomes[0].message == "add(2, 3) should be 5, not -1"
    assert outcomes[1].message == "an assert failed (tests.py, line 9)"  # no message: the line
    lines = runner.report(outcomes)
    assert lines[0] == "FAIL test_adds: add(2, 3) should be 5, not -1"
    assert lines[2] == "PASS test_zero" and lines[-1] == "FAILED: 1 of 3 tests passed"
    assert not runner.all_passed(outcomes)


def test_the_starter_says_it_is_not_written() -> None:
    outcomes = runner.run("def add(a, b):\n    raise NotImplementedError\n", TESTS)
    assert not any(o.passed for o in outcomes)
    assert all(o.message.startswith("NotImplementedError: not written yet") for o in outcomes)


def test_a_syntax_error_is_one_clear_failure() -> None:
    outcomes = runner.run("def add(a, b):\n    return (a +\n", TESTS)
    assert _names(outcomes) == [("load", False)]
    assert outcomes[0].message.startswith("the file does not load: SyntaxError: ")
    assert "(your code, line 2)" in outcomes[0].message
    assert runner.report(outcomes)[-1] == "FAILED: the file does not load"


@pytest.mark.parametrize(
    "source, shown",
    [
        ("import numpy_that_is_not_there\n", "ModuleNotFoundError: No module named"),
        ("x = 1 / 0\n", "ZeroDivisionError: division by zero (your code, line 1)"),
        ("import sys\nsys.exit(3)\n", "SystemExit: 3 (your code, line 2)"),
    ],
)
def test_an_error_while_loading_is_one_clear_failure(source: str, shown: str) -> None:
    outcomes = runner.run(source, TESTS)
    assert _names(outcomes) == [("load", False)]
    assert shown in outcomes[0].message


def test_an_error_in_the_learners_function_names_its_line() -> None:
    source = "def add(a, b):\n    x = 1\n    return [a, b][b]\n"
    outcomes = runner.run(source, TESTS)
    assert outcomes[0].message == "IndexError: list index out of range (your code, line 3)"
    assert outcomes[2].passed  # [0, 0][0] == 0


def test_a_keyboard_interrupt_in_the_learners_code_is_a_failure_not_a_crash() -> None:
    outcomes = runner.run("def add(a, b):\n    raise KeyboardInterrupt\n", TESTS)
    assert not any(o.passed for o in outcomes) and len(outcomes) == 3
    assert outcomes[0].message.startswith("KeyboardInterrupt")


def test_a_missing_function_fails_each_test() -> None:
    outcomes = runner.run("def plus(a, b):\n    return a + b\n", TESTS)
    assert not any(o.passed for o in outcomes)
    assert "has no attribute 'add'" in outcomes[0].message


def test_an_endless_loop_is_cut_off_and_the_rest_not_run() -> None:
    source = "def add(a, b):\n    while a != 0:\n        pass\n    return a + b\n"
    outcomes = runner.run(source, TESTS, limit_s=0.3)
    assert outcomes[0].message == "took longer than 0.3 s (an endless loop?)"
    assert outcomes[1].message == "not run: an earlier test timed out"
    assert outcomes[2].message == "not run: an earlier test timed out"


def test_an_endless_loop_while_loading_is_cut_off_too() -> None:
    outcomes = runner.run("while True:\n    pass\n", TESTS, limit_s=0.3)
    assert [(o.name, o.message) for o in outcomes] == [
        ("load", "the file does not load: took longer than 0.3 s (an endless loop?)")
    ]


@pytest.mark.parametrize(
    "error",
    [
        "MemoryError",
        # torch's, on the CPU, when an allocation fails
        "RuntimeError(\"[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
        "allocate memory: you tried to allocate 2097152000 bytes. Error code 12 (Cannot allocate "
        'memory)")',
    ],
)
def test_running_out_of_memory_is_one_clear_failure_and_the_rest_not_run(error: str) -> None:
    """The cap itself is set in judge.py's child (test_practice_limits.py); here, the words."""
    source = f"def add(a, b):\n    raise {error}\n"
    outcomes = runner.run(source, TESTS, memory_mb=512)
    assert outcomes[0].message == "used more than 512 MB (a list or a loop that grows without end?)"
    assert [o.message for o in outcomes[1:]] == [
        "not run: an earlier test used too much memory"
    ] * 2
    uncapped = runner.run(source, TESTS)  # the browser: its own limit, whatever it is
    assert uncapped[0].message.startswith("MemoryError: ran out of memory")
    at_load = runner.run(f"raise {error}\n", TESTS, memory_mb=512)
    assert (
        at_load[0].message == "the file does not load: used more than 512 MB (a list or a "
        "loop that grows without end?)"
    )


def test_a_learners_except_does_not_swallow_the_time_limit(tmp_path: Path) -> None:
    """In a child process, as judge.py runs it: were the limit catchable, this would never end."""
    source = (
        "def add(a, b):\n    while True:\n        try:\n            while True:\n"
        "                pass\n        except Exception:\n            pass\n"
    )
    (tmp_path / "mine.py").write_text(source)
    (tmp_path / "tests.py").write_text(TESTS)
    done = subprocess.run(
        [
            sys.executable,
            str(PRACTICE / "runner.py"),
            str(tmp_path / "mine.py"),
            str(tmp_path / "tests.py"),
            "0.3",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    outcomes = json.loads(done.stdout)["outcomes"]
    assert outcomes[0]["message"] == "took longer than 0.3 s (an endless loop?)"


def test_only_the_modules_own_test_functions_run() -> None:
    tests = "from math import sqrt as test_sqrt\n" + TESTS + "test_value = 3\n"
    assert [o.name for o in runner.run(GOOD, tests)] == ["test_adds", "test_negative", "test_zero"]


def test_dataclasses_work_in_the_learners_code() -> None:
    source = (
        "from __future__ import annotations\nfrom dataclasses import dataclass\n\n"
        "@dataclass\nclass P:\n    x: int\n\ndef add(a, b):\n    return P(a + b).x\n"
    )
    assert runner.all_passed(runner.run(source, TESTS))


def test_run_json_is_what_the_browser_reads() -> None:
    data = json.loads(runner.run_json("def add(a, b):\n    return a * b\n", TESTS))
    assert data["outcomes"][0] == {
        "name": "test_adds",
        "passed": False,
        "message": "add(2, 3) should be 5, not 6",
    }
    assert data["report"][-1] == "FAILED: 1 of 3 tests passed"  # 0 * 0 == 0
    broken = json.loads(runner.run_json(GOOD, "def test_x(solution):\n    return (\n"))
    assert broken["outcomes"][0]["name"] == "tests"
    assert "the exercise's tests do not load" in broken["outcomes"][0]["message"]


def test_the_runner_imports_nothing_outside_the_standard_library() -> None:
    """The same file runs in Pyodide, which has the standard library and nothing else here."""
    import ast

    tree = ast.parse((PRACTICE / "runner.py").read_text(encoding="utf-8"))
    assert judge._imports(tree) <= set(sys.stdlib_module_names)


# --- judge.py's command line, on a copy of practice/ ------------------------------------------


@pytest.fixture
def practice(tmp_path: Path) -> Path:
    folder = tmp_path / "practice"
    folder.mkdir()
    for name in ("runner.py", "judge.py"):
        shutil.copy(PRACTICE / name, folder / name)
    shutil.copytree(PRACTICE / EXAMPLE, folder / EXAMPLE)
    return folder


def _judge(practice: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(practice / "judge.py"), *args],
        cwd=practice.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_judging_the_starter_makes_the_working_copy_and_fails(practice: Path) -> None:
    done = _judge(practice, "171")
    assert done.returncode == 1, done.stderr
    work = practice / "work" / "171.py"
    assert work.read_text() == (practice / EXAMPLE / "starter.py").read_text()
    lines = done.stdout.splitlines()
    assert lines[0] == "created practice/work/171.py from the starter: write your solution there"
    assert lines[1] == "judging practice/work/171.py: 171 · CUDA-graph bucket padding (easy)"
    assert lines[2].startswith("FAIL test_small_maxima: NotImplementedError")
    assert lines[-1] == "FAILED: 0 of 9 tests passed"


def test_the_reference_passes(practice: Path) -> None:
    done = _judge(practice, "--reference", "171")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "PASSED: all 9 tests"
    assert done.stdout.count("\nPASS test_") == 9


def test_a_file_that_does_not_load_gets_one_fail_line(practice: Path, tmp_path: Path) -> None:
    broken = tmp_path / "mine.py"
    broken.write_text("def graph_batch_sizes(max_bs):\n    return [1,\n")
    done = _judge(practice, "171", str(broken))
    assert done.returncode == 1
    assert done.stdout.splitlines()[1:] == [
        "FAIL load: the file does not load: SyntaxError: '[' was never closed (your code, line 2)",
        "FAILED: the file does not load",
    ]


def test_a_relative_path_is_judged_like_an_absolute_one(practice: Path) -> None:
    """The learner types the path from the repository's root; the tests run elsewhere."""
    done = _judge(practice, "171", f"practice/{EXAMPLE}/reference.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "PASSED: all 9 tests"


def test_what_the_learners_code_prints_is_shown_apart(practice: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine.py"
    mine.write_text((practice / EXAMPLE / "reference.py").read_text() + "print('thinking')\n")
    done = _judge(practice, "171", str(mine))
    assert done.returncode == 0
    assert done.stdout.splitlines()[1:3] == ["your code printed:", "thinking"]


def test_list_marks_the_solved_ones(practice: Path) -> None:
    def row() -> list[str]:
        done = _judge(practice, "--list")
        assert done.returncode == 0, done.stderr
        return next(line for line in done.stdout.splitlines() if line.startswith("171")).split()

    assert row()[:5] == ["171", "17", "easy", "browser", "-"]  # not begun
    _judge(practice, "171")
    assert row()[4] == "no"  # the starter
    shutil.copy(practice / EXAMPLE / "reference.py", practice / "work" / "171.py")
    assert row()[4] == "yes"


@pytest.mark.parametrize(
    "args, message",
    [
        (["999"], "judge.py: error: no exercise '999' (exercises: 171)"),
        (["171", "no_such_file.py"], "judge.py: error: no file no_such_file.py"),
        ([], "judge.py: error: name an exercise, e.g. judge.py 171 (or --list)"),
        (
            ["--reference", "171", "x.py"],
            "judge.py: error: --reference judges the reference: give no FILE",
        ),
    ],
)
def test_bad_input_is_one_line_and_status_2(practice: Path, args: list[str], message: str) -> None:
    done = _judge(practice, *args)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", message + "\n")


# --- naming an exercise: its id, or its chapter as steps.py names chapters ----------------------


@pytest.mark.parametrize(
    "name, found",
    [
        ("052", "052"),
        ("52", "052"),  # the id without its leading zero
        ("052_paged_attend", "052"),
        ("paged_attend", "052"),
        ("17", "171"),  # chapter 17 has one exercise
        ("ch17", "171"),
        ("ch17_cudagraph", "171"),
        ("20", "203"),
        ("ch20_moe", "203"),
    ],
)
def test_an_exercise_is_found_by_any_of_its_names(name: str, found: str) -> None:
    assert judge.find(name).id == found


@pytest.mark.parametrize(
    "name, message",
    [
        ("5", "chapter 5 has 2 exercises, 051, 052: name one, e.g. judge.py 051"),
        ("ch05_kvcache", "chapter 5 has 2 exercises, 051, 052: name one, e.g. judge.py 051"),
        (
            "11",
            "'11' names exercise 011 and chapter 11 (exercises 111, 112): write 011 for the "
            "exercise, ch11 for the chapter",
        ),
        ("ch17_graphs", "no exercise 'ch17_graphs'"),  # chapter 17's folder is ch17_cudagraph
        ("017", "no exercise '017'"),  # three digits are an exercise's id, never a chapter
        ("ch99", "no exercise 'ch99'"),
    ],
)
def test_a_name_that_is_not_one_exercise_says_why(name: str, message: str) -> None:
    with pytest.raises(judge.ExerciseError) as raised:
        judge.find(name)
    assert str(raised.value).startswith(message)


def test_every_form_steps_py_accepts_for_a_chapter_finds_its_exercises() -> None:
    from stepslib.book import load_book, parse_selection

    book = load_book(REPO)
    known = judge.folders()
    for chapter in book.chapters:
        n = chapter.number
        ids = [i for i in known if int(i[:2]) == n]
        for form in (str(n), f"{n:02d}", f"ch{n}", chapter.id, chapter.name):
            assert parse_selection(book, form) == [chapter], form
            if not ids or (form.isdigit() and f"{int(form):03d}" in known):
                continue  # no exercise, or also an exercise's id (011 for 11): both said above
            if len(ids) == 1:
                assert judge.find(form).id == ids[0], form
            else:
                with pytest.raises(judge.ExerciseError, match=f"chapter {n} has {len(ids)}"):
                    judge.find(form)


def test_the_command_line_judges_an_exercise_named_by_its_chapter(practice: Path) -> None:
    done = _judge(practice, "--reference", "ch17")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith("judging practice/171_graph_padding/reference.py")


# --- what steps.py check asks of an exercise --------------------------------------------------


def _edit(folder: Path, name: str, old: str, new: str) -> None:
    path = folder / name
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_the_example_verifies(practice: Path) -> None:
    exercise = judge.load(practice / EXAMPLE)
    assert exercise.functions == ("graph_batch_sizes", "padded_size")
    assert judge.verify(exercise, REPO) == []


@pytest.mark.parametrize(
    "old, new, message",
    [
        ('id = "171"', 'id = "172"', "id is '172', but the folder says 171"),
        ("chapter = 17", "chapter = 7", "chapter is 7, but id 171 says 17"),
        ('difficulty = "easy"', 'difficulty = "simple"', "difficulty must be one of easy, medium"),
        ('runs = "browser"', 'runs = "gpu"', "runs must be one of browser, local"),
        ('title = "CUDA-graph bucket padding"\n', "", "title must be a str"),
        ("chapter = 17", 'chapter = "17"', "chapter must be a int"),
        ("source =", "sources =", "source must be a str"),
        (
            'function = "graph_batch_sizes, padded_size"',
            'function = "graph-batch-sizes"',
            "function must name Python functions",
        ),
    ],
)
def test_exercise_toml_is_checked(practice: Path, old: str, new: str, message: str) -> None:
    _edit(practice / EXAMPLE, "exercise.toml", old, new)
    with pytest.raises(judge.ExerciseError, match=message):
        judge.load(practice / EXAMPLE)


def test_an_unknown_field_is_refused(practice: Path) -> None:
    with open(practice / EXAMPLE / "exercise.toml", "a") as f:
        f.write("timeout = 3\n")
    with pytest.raises(judge.ExerciseError, match="unknown field 'timeout'"):
        judge.load(practice / EXAMPLE)


@pytest.mark.parametrize(
    "name, old, new, message",
    [
        (
            "README.md",
            "# 171 · CUDA-graph bucket padding (easy)",
            "# 171 · Bucket padding (easy)",
            "README.md begins '# 171 · Bucket padding (easy)', not '# 171 · CUDA-graph bucket "
            "padding (easy)'",
        ),
        (
            "exercise.toml",
            "engine/graph.py",
            "engine/graphs.py",
            "source python/minisgl/engine/graphs.py does not exist",
        ),
        ("starter.py", "def padded_size(", "def pad(", "starter.py does not define padded_size"),
        (
            "reference.py",
            "from __future__ import annotations",
            "from __future__ import annotations\nimport numpy as np",
            "reference.py imports numpy: a browser exercise is pure Python",
        ),
        ("tests.py", "def test_", "def check_", "tests.py has no test_ function"),
        ("tests.py", "import random", "import random(", "tests.py does not parse"),
    ],
)
def test_the_files_are_checked(practice: Path, name: str, old: str, new: str, message: str) -> None:
    _edit(practice / EXAMPLE, name, old, new)
    found = judge.verify(judge.load(practice / EXAMPLE), REPO)
    assert any(message in problem for problem in found), found


def test_a_missing_file_is_named(practice: Path) -> None:
    (practice / EXAMPLE / "reference.py").unlink()
    assert judge.verify(judge.load(practice / EXAMPLE), REPO) == ["reference.py is missing"]


def test_a_starter_that_passes_is_caught(practice: Path) -> None:
    shutil.copy(practice / EXAMPLE / "reference.py", practice / EXAMPLE / "starter.py")
    found = judge.verify(judge.load(practice / EXAMPLE), REPO)
    assert found == ["the starter passes the tests"]


def test_a_reference_that_fails_is_caught(practice: Path) -> None:
    _edit(practice / EXAMPLE, "reference.py", "bs >= batch_size", "bs > batch_size")
    found = judge.verify(judge.load(practice / EXAMPLE), REPO)
    assert found and all(p.startswith("the reference fails test_") for p in found)
    assert (
        "the reference fails test_examples_of_padding: padded_size([1, 2, 4, 8, 16], 1) "
        "should be 1, not 2" in found
    )


def test_two_folders_for_one_id_are_refused(practice: Path) -> None:
    shutil.copytree(practice / EXAMPLE, practice / "171_again")
    with pytest.raises(judge.ExerciseError, match="two folders for exercise 171"):
        judge.folders(practice)
