"""Run an exercise's tests against a learner's code and say, test by test, what came of it.

Pure Python with no third-party import: the same file runs under `practice/judge.py` (in a
child process, so that a judge can time it out) and in the reader's browser through Pyodide
(the site's worker calls `run_json`). Both print the lines of `report`, so a solution gets
the same verdict in either place.

A tests module holds plain functions `test_<what>(solution)` that take the learner's module
and check it with `assert`; they run in the order they are written.

A runaway solution is cut off and said to be one: a test that runs longer than `limit_s`
fails "took longer than N s", one that runs out of memory fails "used more than N MB" (under
judge.py the child caps its own memory first, see `cap_memory`), and the tests after it are
not run.
"""

from __future__ import annotations

import contextlib
import errno
import gc
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
    return [
        (name, value)
        for name, value in vars(tests).items()
        if name.startswith("test_")
        and callable(value)
        and getattr(value, "__module__", None) == tests.__name__
    ]


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


def run(
    solution_source: str,
    tests_source: str,
    limit_s: float | None = None,
    memory_mb: float | None = None,
) -> list[Outcome]:
    """Every test's outcome; a solution that does not load is one failed `load` outcome. With
    `limit_s` (where there are signals: not in the browser) a test, or the loading, running
    longer fails; a test that runs out of memory fails too (`memory_mb`, the cap, only words
    the message). After a runaway test the tests after it are not run."""
    tests = load_module("practice_tests", tests_source, TESTS_FILE)  # its errors are ours
    try:
        with _time_limit(limit_s):  # a module-level endless loop is the learner's too
            solution = load_module("solution", solution_source, SOLUTION_FILE)
    except _TimedOut:
        return [Outcome(LOAD, False, f"the file does not load: {_timed_out(limit_s)}")]
    except MemoryError:
        solution = None  # said below, once the error and what it holds are gone
    except (Exception, SystemExit, KeyboardInterrupt) as e:
        if not _is_out_of_memory(e):
            return [Outcome(LOAD, False, f"the file does not load: {describe(e)}")]
        solution = None
    if solution is None:
        gc.collect()
        return [Outcome(LOAD, False, f"the file does not load: {_out_of_memory(memory_mb)}")]
    outcomes: list[Outcome] = []
    stopped = ""  # why the tests after a runaway one are not run
    try:
        for name, test in collect_tests(tests):
            if stopped:
                outcomes.append(Outcome(name, False, f"not run: an earlier test {stopped}"))
                continue
            outcome, stopped = _run_one(name, test, solution, limit_s, memory_mb)
            outcomes.append(outcome)
        return outcomes
    finally:
        sys.modules.pop("solution", None)
        sys.modules.pop("practice_tests", None)


def _run_one(
    name: str,
    test: Callable,
    solution: types.ModuleType,
    limit_s: float | None,
    memory_mb: float | None,
) -> tuple[Outcome, str]:
    """The test's outcome, and why no test should follow it ("" when they may)."""
    try:
        with _time_limit(limit_s):
            test(solution)
    except _TimedOut:
        return Outcome(name, False, _timed_out(limit_s)), "timed out"
    except MemoryError:
        pass  # nothing is made here: until this block is left, the error's frames hold it all
    # SystemExit: a solution that calls sys.exit; KeyboardInterrupt: one that raises it
    except (Exception, SystemExit, KeyboardInterrupt) as e:
        if isinstance(e, OSError) and e.errno == errno.EFBIG and memory_mb is not None:
            message = f"printed more than {OUTPUT_LIMIT_MB} MB (a print in an endless loop?)"
            return Outcome(name, False, message), "printed too much"
        if not _is_out_of_memory(e):  # torch's RuntimeError, when it is, goes on below
            return Outcome(name, False, describe(e)), ""
    else:
        return Outcome(name, True), ""
    gc.collect()  # what it built in cycles (a tree's parents and children) is freed only so
    # What the learner's code holds may not all be freed (a global list): the next test
    # would only run out again, so none is run.
    return Outcome(name, False, _out_of_memory(memory_mb)), "used too much memory"


TIMED_OUT = "took longer than"
USED_MORE = "used more than"


def _timed_out(limit_s: float | None) -> str:
    return f"{TIMED_OUT} {limit_s:g} s (an endless loop?)"


def _out_of_memory(memory_mb: float | None) -> str:
    if memory_mb is None:  # the browser's own limit, or the machine's
        return "MemoryError: ran out of memory (a list or a loop that grows without end?)"
    return f"{USED_MORE} {memory_mb:g} MB (a list or a loop that grows without end?)"


def _is_out_of_memory(error: BaseException) -> bool:
    """A MemoryError (numpy's is one), or torch's RuntimeError from a failed allocation."""
    if isinstance(error, MemoryError):
        return True
    text = str(error)
    return "Cannot allocate memory" in text or "can't allocate memory" in text


class _TimedOut(BaseException):  # not an Exception, so the learner's `except` lets it through
    pass


ALARM_AGAIN_S = 0.25  # after the limit, the alarm repeats this often until the test ends


@contextlib.contextmanager
def _time_limit(limit_s: float | None):
    if limit_s is None or not hasattr(signal, "setitimer"):
        yield
        return

    def alarm(signum: int, frame: types.FrameType | None) -> None:
        # Not in the `finally` below, or on the way to it: it would skip turning the alarm off.
        if frame is None or frame.f_code not in _ENDING:
            raise _TimedOut

    # The alarm repeats: raised inside a __del__, a weakref callback or a gc callback (where a
    # signal lands when it arrives during a garbage collection), _TimedOut is printed and
    # dropped, and a one-off alarm would let an endless loop run on and on.
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, limit_s, ALARM_AGAIN_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


_ENDING = {_time_limit.__wrapped__.__code__, contextlib._GeneratorContextManager.__exit__.__code__}


def cap_memory(memory_mb: float) -> bool:
    """Cap this process's data at `memory_mb` MB (2**20 bytes), where the system has the
    `resource` module (not on Windows); True when it did. RLIMIT_DATA, not RLIMIT_AS: torch
    maps far more address space than it uses (its libraries, its threads' reserves), and
    RLIMIT_DATA counts only the heap and private writable maps, which is what a runaway
    allocation grows. Past the cap an allocation fails: a MemoryError, or torch's RuntimeError.
    What it writes is capped too (RLIMIT_FSIZE: judge.py keeps it in a file), so that a
    printing loop cannot fill the disk: past OUTPUT_LIMIT_MB a write fails with EFBIG."""
    try:
        import resource
    except ImportError:
        return False
    _set_limit(resource, resource.RLIMIT_FSIZE, OUTPUT_LIMIT_MB)  # best effort: spares the disk
    return _set_limit(resource, resource.RLIMIT_DATA, memory_mb)


def _set_limit(resource: types.ModuleType, which: int, megabytes: float) -> bool:
    _, hard = resource.getrlimit(which)
    wanted = int(megabytes * 2**20)
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    try:
        resource.setrlimit(which, (wanted, hard))
    except (ValueError, OSError):  # a system that refuses it: judged without the cap
        return False
    return True


OUTPUT_LIMIT_MB = 64  # the most one file (what the learner's code prints) may grow to


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


def run_json(
    solution_source: str,
    tests_source: str,
    limit_s: float | None = None,
    memory_mb: float | None = None,
) -> str:
    """The outcomes and the report's lines, as JSON: the browser's entry, and judge.py's."""
    try:
        outcomes = run(solution_source, tests_source, limit_s, memory_mb)
    except Exception as e:  # the tests themselves broke: the exercise's fault, said as such
        outcomes = [Outcome("tests", False, f"the exercise's tests do not load: {describe(e)}")]
    return json.dumps({"outcomes": [asdict(o) for o in outcomes], "report": report(outcomes)})


def main(argv: list[str]) -> int:
    """`python runner.py SOLUTION TESTS LIMIT_S [MEMORY_MB]`: the outcomes as JSON on stdout,
    for judge.py; what the learner's code prints goes to stderr. With MEMORY_MB the process
    caps its memory before it reads anything (judge.py passes it: here rather than in a
    `preexec_fn`, which is not safe in a parent with threads, as `steps.py check` has)."""
    if len(argv) not in (3, 4):
        print("usage: runner.py SOLUTION TESTS LIMIT_S [MEMORY_MB]", file=sys.stderr)
        return 2
    memory_mb = float(argv[3]) if len(argv) == 4 else None
    if memory_mb is not None and not cap_memory(memory_mb):
        memory_mb = None  # no cap here: a MemoryError is the machine's, not N MB
    solution, tests = (open(path, encoding="utf-8").read() for path in argv[:2])
    with contextlib.redirect_stdout(sys.stderr):
        result = run_json(solution, tests, float(argv[2]), memory_mb)
    print(result)
    return 0


def main_many(argv: list[str]) -> int:
    """`python runner.py --many TESTS LIMIT_S MEMORY_MB SOLUTION...` (MEMORY_MB `-`: no cap):
    each solution judged in turn, in this one process, its JSON a line of stdout as soon as it
    is judged, so that the lines before a crash are kept. For judge.py's `judge_many`."""
    if len(argv) < 4:
        print("usage: runner.py --many TESTS LIMIT_S MEMORY_MB SOLUTION...", file=sys.stderr)
        return 2
    tests_path, limit_s, memory = argv[0], float(argv[1]), argv[2]
    memory_mb = None if memory == "-" else float(memory)
    if memory_mb is not None and not cap_memory(memory_mb):
        memory_mb = None
    tests = open(tests_path, encoding="utf-8").read()
    for path in argv[3:]:
        solution = open(path, encoding="utf-8").read()
        with contextlib.redirect_stdout(sys.stderr):
            result = run_json(solution, tests, limit_s, memory_mb)
            gc.collect()  # what a solution built in cycles goes before the next one starts
        print(result, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main_many(sys.argv[2:]) if sys.argv[1:2] == ["--many"] else main(sys.argv[1:]))
