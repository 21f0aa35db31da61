"""Running a chapter's main and tests in a written-out tree, in a fixed environment.

The environment is the same on every machine: no GPU visible (for a `requires: cpu` chapter),
one thread for the math libraries, a fixed hash seed, no hub. Prints are compared exactly, or,
where a chapter declares a `tolerance`, number by number within it.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .book import Chapter
from .report import cut, failure_report, fold_library_frames
from .warm import WarmGone, WarmPython

MAIN_TIMEOUT = 600
TESTS_TIMEOUT = 1800
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def fixed_env(python_path: Path, gpu: bool = False) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "PYTEST", "TRITON_", "OMP_", "MKL_"))
    }
    env.update(
        PYTHONPATH=str(python_path),
        PYTHONHASHSEED="0",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONIOENCODING="utf-8",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        COLUMNS="100",
    )
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def has_gpu() -> bool:
    """Whether CUDA is usable, judged without importing torch (which takes seconds)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return (gpus.is_dir() and any(gpus.iterdir())) or Path("/dev/nvidia0").exists()


def missing_needs(chapter: Chapter) -> list[str]:
    return [name for name in chapter.needs if importlib.util.find_spec(name) is None]


Test = tuple[str, str, str]  # (pytest node id, passed / failed / skipped / xfailed, why skipped)


@dataclass
class Outcome:
    ok: bool
    output: str  # stdout of a main; the test runner's report of tests
    detail: str = ""  # what explains a failure: stderr, a diff, the first failing test
    tests: list[Test] = field(default_factory=list)
    first_failure: str | None = None  # the node id of the failure `detail` shows whole

    @property
    def summary(self) -> str:
        return count_outcomes(self.tests) or "no tests"


def count_outcomes(tests: list[Test]) -> str:
    """`1 failed, 12 passed, 3 skipped`: the outcomes that occur, in the order of their names."""
    counts = Counter(outcome for _, outcome, _ in tests)
    return ", ".join(f"{n:,} {outcome}" for outcome, n in sorted(counts.items()))


def server_env() -> dict[str, str]:
    """The warm server's environment: a job's, without the tree it will be given.

    Without a GPU, every main and test of the book chooses Triton's interpreter before it imports
    triton; the server imports triton too (torch._dynamo does), so it must make the same choice.
    """
    env = fixed_env(Path())
    del env["PYTHONPATH"]
    if not has_gpu():
        env["TRITON_INTERPRET"] = "1"
    return env


def python(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float, warm: WarmPython | None = None
) -> subprocess.CompletedProcess:
    """`python ARGV` in `cwd`, its output captured: forked from `warm` when it is given and up
    (a GPU job never is: its environment differs), else a new process."""
    if warm is not None and warm.usable():
        try:
            return warm.run([sys.executable, *argv], cwd, env, timeout)
        except WarmGone:
            pass
    return subprocess.run(
        [sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def run_main(
    tree: Path, main: str, python_path: Path, gpu: bool = False, warm: WarmPython | None = None
) -> Outcome:
    try:
        done = python(
            [main], tree, fixed_env(python_path, gpu), MAIN_TIMEOUT, None if gpu else warm
        )
    except subprocess.TimeoutExpired:
        return Outcome(False, "", f"{main} ran longer than {MAIN_TIMEOUT} s")
    if done.returncode != 0:
        return Outcome(
            False,
            done.stdout,
            f"{main} exited with {done.returncode}:\n{cut(fold_library_frames(done.stderr), 4000)}",
        )
    return Outcome(True, done.stdout)


def run_tests(
    tree: Path,
    tests: list[str],
    python_path: Path,
    gpu: bool = False,
    warm: WarmPython | None = None,
) -> Outcome:
    report = tree / ".steps-junit.xml"
    # A warm server has imported anyio (transformers does), which pytest would warn it cannot
    # rewrite as a plugin: a warning a new process never shows. Short tracebacks: a frame is its
    # one line, not its function's whole source (a library's can run to hundreds of lines).
    command = [
        "-m",
        "pytest",
        "-q",
        "--tb=short",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        ".",
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        f"--junitxml={report}",
        *tests,
    ]
    try:
        done = python(
            command, tree, fixed_env(python_path, gpu), TESTS_TIMEOUT, None if gpu else warm
        )
    except subprocess.TimeoutExpired:
        return Outcome(False, "", f"the tests ran longer than {TESTS_TIMEOUT} s")
    results = _junit_results(report, tree)
    output = done.stdout + done.stderr
    if done.returncode == 5 or not results:
        return Outcome(False, output, f"{' '.join(tests)} collected no test", results)
    if done.returncode == 0:
        return Outcome(True, output, "", results)
    failed = [node for node, outcome, _ in results if outcome == "failed"]
    detail, first = failure_report(output, failed)
    return Outcome(False, output, detail, results, first)


def _junit_results(report: Path, tree: Path) -> list[Test]:
    """A Test for each case the report names, in the order they ran."""
    if not report.is_file():
        return []
    results = []
    for case in ET.parse(report).getroot().iter("testcase"):
        name = _node_id(case.get("classname", ""), case.get("name", ""), tree)
        kinds = {child.tag: child for child in case}
        skipped = kinds.get("skipped")
        if kinds.keys() & {"failure", "error"}:
            results.append((name, "failed", ""))
        elif skipped is None:
            results.append((name, "passed", ""))
        elif skipped.get("type") == "pytest.xfail":
            results.append((name, "xfailed", skipped.get("message", "")))
        else:
            results.append((name, "skipped", _skip_reason(skipped)))
    return results


def _skip_reason(skipped: ET.Element) -> str:
    """The reason a test gave; a module skipped whole has its reason in a tuple's repr."""
    reason = skipped.get("message", "")
    if reason == "collection skipped":  # the text is repr((path, line, "Skipped: why"))
        try:
            reason = str(ast.literal_eval(skipped.text or "")[2])
        except (ValueError, SyntaxError, IndexError, TypeError):
            pass
    return reason.removeprefix("Skipped: ")


def _node_id(classname: str, name: str, tree: Path) -> str:
    """junit's `tests.test_x.TestY` and `test_z` back to `tests/test_x.py::TestY::test_z`.

    A module that is skipped or fails to import whole comes as classname "", name `tests.test_x`.
    """
    if not classname:
        classname, name = name, ""
    parts = classname.split(".")
    for cut_at in range(len(parts), 0, -1):
        path = "/".join(parts[:cut_at]) + ".py"
        if (tree / path).is_file():
            return "::".join([path, *parts[cut_at:], *([name] if name else [])])
    return f"{classname}::{name}" if name else classname


def same_prints(recorded: str, printed: str, tolerance: float | None) -> bool:
    """Equal text; with a tolerance, the numbers may differ by at most that much."""
    if recorded == printed:
        return True
    if tolerance is None:
        return False
    if NUMBER.split(recorded) != NUMBER.split(printed):
        return False
    a, b = NUMBER.findall(recorded), NUMBER.findall(printed)
    return len(a) == len(b) and all(abs(float(x) - float(y)) <= tolerance for x, y in zip(a, b))


def lines_differing(recorded: str, printed: str) -> str:
    """`2 lines differ`: the recorded lines not printed, or the printed ones not recorded."""
    a, b = recorded.splitlines(), printed.splitlines()
    matched = sum(
        block.size
        for block in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks()
    )
    differing = max(len(a), len(b)) - matched
    return "1 line differs" if differing == 1 else f"{differing:,} lines differ"


def prints_diff(
    recorded: str, printed: str, name: str, labels: tuple[str, str] = ("recorded", "printed now")
) -> str:
    lines = difflib.unified_diff(
        recorded.splitlines(keepends=True),
        printed.splitlines(keepends=True),
        f"{name} ({labels[0]})",
        f"{name} ({labels[1]})",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)
