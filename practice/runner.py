"""Run an exercise's tests against a learner's code and say, test by test, what came of it.

Pure Python with no third-party import: the same file runs under `practice/judge.py` (in a
child process, so that a judge can time it out) and in the reader's browser through Pyodide
(the site's worker calls `run_json`). Both print the lines of `report`, so a solution gets
the same verdict in either place.

A tests module holds plain functions `test_<what>(solution)` that take the learner's module
and check it with `assert`; they run in the order they are written.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import traceback
import types
from dataclasses import asdict, dataclass
from typing import Callable

SOLUTION_FILE = "your code"  # the names frames carry, so a message can say where it broke
TESTS_FILE = "tests.py"
LOAD = "load"  # the outcome's name when the learner's file does not load at all


@dataclass
class Outcome:
    name: str
    passed: bool
    message: str = ""


def load_module(name: str, source: str, filename: str) -> types.ModuleType:
    """Execute `source` as a fresh module; a SyntaxError or the module's own error escapes."""
    code = compile(source, filename, "exec")
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module  # dataclasses and pickling look a class's module up here
    try:
        exec(code, module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def collect_tests(tests: types.ModuleType) -> list[tuple[str, Callable]]:
    """The module's own `test_*` functions, in the order they are written."""
    return [(name, value) for name, value in vars(tests).items()
            if name.startswith("test_") and callable(value)
            and getattr(value, "__module__", None) == tests.__name__]


def describe(error: BaseException) -> str:
    """One line on what went wrong and where: the learner's line when the error came from it."""
    if isinstance(error, SyntaxError):
        return f"SyntaxError: {error.msg} ({error.filename}, line {error.lineno})"
    if isinstance(error, NotImplementedError):
        return "NotImplementedError: not written yet (the starter's body is still there)"
    where = _where(error)
    if isinstance(error, AssertionError):
        return str(error) or f"an assert failed{where}"
    return f"{type(error).__name__}: {error}{where}"


def _where(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    for wanted in (SOLUTION_FILE, TESTS_FILE):
        lines = [f.lineno for f in frames if f.filename == wanted]
        if lines:
            return f" ({wanted}, line {lines[-1]})"
    return ""


def run(solution_source: str, tests_source: str, limit_s: float | None = None) -> list[Outcome]:
    """Every test's outcome; a solution that does not load is one failed `load` outcome. With
    `limit_s` (where there are signals: not in the browser) a test running longer fails, and
    the tests after it are not run."""
    tests = load_module("practice_tests", tests_source, TESTS_FILE)  # its errors are ours
    try:
        solution = load_module("solution", solution_source, SOLUTION_FILE)
    except (Exception, SystemExit, KeyboardInterrupt) as e:
        return [Outcome(LOAD, False, f"the file does not load: {describe(e)}")]
    outcomes: list[Outcome] = []
    try:
        for name, test in collect_tests(tests):
            if any(o.message.startswith(TIMED_OUT) for o in outcomes):
                outcomes.append(Outcome(name, False, "not run: an earlier test timed out"))
            else:
                outcomes.append(_run_one(name, test, solution, limit_s))
        return outcomes
    finally:
        sys.modules.pop("solution", None)
        sys.modules.pop("practice_tests", None)


def _run_one(name: str, test: Callable, solution: types.ModuleType,
             limit_s: float | None) -> Outcome:
    try:
        with _time_limit(limit_s):
            test(solution)
    except _TimedOut:
        return Outcome(name, False, f"{TIMED_OUT} {limit_s:g} s (an endless loop?)")
    # SystemExit: a solution that calls sys.exit; KeyboardInterrupt: one that raises it
    except (Exception, SystemExit, KeyboardInterrupt) as e:
        return Outcome(name, False, describe(e))
    return Outcome(name, True)


TIMED_OUT = "took longer than"


class _TimedOut(BaseException):  # not an Exception, so the learner's `except` lets it through
    pass


@contextlib.contextmanager
def _time_limit(limit_s: float | None):
    if limit_s is None or not hasattr(signal, "setitimer"):
        yield
        return

    def alarm(signum: int, frame: object) -> None:
        raise _TimedOut

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def report(outcomes: list[Outcome]) -> list[str]:
    """One line per test, then the verdict."""
    lines = [f"PASS {o.name}" if o.passed else f"FAIL {o.name}: {o.message}" for o in outcomes]
    passed = sum(o.passed for o in outcomes)
    if outcomes and passed == len(outcomes):
        lines.append(f"PASSED: all {passed} tests")
    elif outcomes and outcomes[0].name == LOAD:
        lines.append("FAILED: the file does not load")
    else:
        lines.append(f"FAILED: {passed} of {len(outcomes)} tests passed")
    return lines


def all_passed(outcomes: list[Outcome]) -> bool:
    return bool(outcomes) and all(o.passed for o in outcomes)


def run_json(solution_source: str, tests_source: str, limit_s: float | None = None) -> str:
    """The outcomes and the report's lines, as JSON: the browser's entry, and judge.py's."""
    try:
        outcomes = run(solution_source, tests_source, limit_s)
    except Exception as e:  # the tests themselves broke: the exercise's fault, said as such
        outcomes = [Outcome("tests", False, f"the exercise's tests do not load: {describe(e)}")]
    return json.dumps({"outcomes": [asdict(o) for o in outcomes], "report": report(outcomes)})


def main(argv: list[str]) -> int:
    """`python runner.py SOLUTION TESTS LIMIT_S`: the outcomes as JSON on stdout, for judge.py;
    what the learner's code prints goes to stderr."""
    if len(argv) != 3:
        print("usage: runner.py SOLUTION TESTS LIMIT_S", file=sys.stderr)
        return 2
    solution, tests = (open(path, encoding="utf-8").read() for path in argv[:2])
    with contextlib.redirect_stdout(sys.stderr):
        result = run_json(solution, tests, float(argv[2]))
    print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
