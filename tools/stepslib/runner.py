"""Running a chapter's main and tests in a written-out tree, in a fixed environment.

The environment is the same on every machine: no GPU visible (for a `requires: cpu` chapter),
one thread for the math libraries, a fixed hash seed, no hub. Prints are compared exactly, or,
where a chapter declares a `tolerance`, number by number within it.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from .book import Chapter

MAIN_TIMEOUT = 600
TESTS_TIMEOUT = 1800
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def fixed_env(python_path: Path, gpu: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "PYTEST", "TRITON_", "OMP_", "MKL_"))}
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


@dataclass
class Outcome:
    ok: bool
    output: str  # stdout of a main; the test runner's report of tests
    detail: str = ""  # what explains a failure: stderr, a diff
    tests: list[tuple[str, str]] = field(default_factory=list)  # (test id, passed/failed/...)

    @property
    def summary(self) -> str:
        counts: dict[str, int] = {}
        for _, result in self.tests:
            counts[result] = counts.get(result, 0) + 1
        return ", ".join(f"{n} {result}" for result, n in sorted(counts.items())) or "no tests"


def run_main(tree: Path, main: str, python_path: Path, gpu: bool = False) -> Outcome:
    try:
        done = subprocess.run([sys.executable, main], cwd=tree, env=fixed_env(python_path, gpu),
                              capture_output=True, text=True, timeout=MAIN_TIMEOUT)
    except subprocess.TimeoutExpired:
        return Outcome(False, "", f"{main} ran longer than {MAIN_TIMEOUT} s")
    if done.returncode != 0:
        return Outcome(False, done.stdout, f"{main} exited with {done.returncode}:\n"
                                           f"{done.stderr[-4000:]}")
    return Outcome(True, done.stdout)


def run_tests(tree: Path, tests: list[str], python_path: Path, gpu: bool = False) -> Outcome:
    report = tree / ".steps-junit.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", ".",
               f"--junitxml={report}", *tests]
    try:
        done = subprocess.run(command, cwd=tree, env=fixed_env(python_path, gpu),
                              capture_output=True, text=True, timeout=TESTS_TIMEOUT)
    except subprocess.TimeoutExpired:
        return Outcome(False, "", f"the tests ran longer than {TESTS_TIMEOUT} s")
    results = _junit_results(report, tree)
    output = done.stdout + done.stderr
    if done.returncode == 5 or not results:
        return Outcome(False, output, f"{' '.join(tests)} collected no test", results)
    return Outcome(done.returncode == 0, output, "" if done.returncode == 0 else output[-6000:],
                   results)


def _junit_results(report: Path, tree: Path) -> list[tuple[str, str]]:
    """(pytest node id, passed / failed / skipped) for each test the report names."""
    if not report.is_file():
        return []
    results = []
    for case in ET.parse(report).getroot().iter("testcase"):
        name = _node_id(case.get("classname", ""), case.get("name", ""), tree)
        kinds = {child.tag for child in case}
        result = ("failed" if kinds & {"failure", "error"} else
                  "skipped" if "skipped" in kinds else "passed")
        results.append((name, result))
    return results


def _node_id(classname: str, name: str, tree: Path) -> str:
    """junit's `tests.test_x.TestY` and `test_z` back to `tests/test_x.py::TestY::test_z`."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (tree / path).is_file():
            return "::".join([path, *parts[cut:], name])
    return f"{classname}::{name}"


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


def prints_diff(recorded: str, printed: str, name: str) -> str:
    lines = difflib.unified_diff(recorded.splitlines(keepends=True),
                                 printed.splitlines(keepends=True),
                                 f"{name} (recorded)", f"{name} (printed now)")
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)
