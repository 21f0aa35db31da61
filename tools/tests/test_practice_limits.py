"""practice/judge.py's limits: every solution runs in a child process with a time limit and a
memory cap, and a runaway one fails with one clear line. Each test here fails where its limit
is missing, in seconds, and the solutions that allocate stop at a bound of their own, so that
without the cap they spin (and fail on time) instead of filling this machine's memory."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRACTICE = REPO / "practice"

resource = pytest.importorskip("resource")  # no cap without it (Windows): nothing to test


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


judge = _module("practice_judge_for_limits", PRACTICE / "judge.py")
runner = judge.runner
EXERCISE = judge.find("171", PRACTICE)  # a browser exercise: graph_batch_sizes, padded_size
CAP_MB = judge.memory_cap_mb(EXERCISE.runs)
GROWS = "without end?)"  # how both memory messages end

# The learner's first function, test_small_maxima's first call, does the running away.
REST = "\n\ndef padded_size(sizes, batch_size):\n    return 0\n"
ALLOCATES = (
    f"""_kept = []

def graph_batch_sizes(max_bs):
    while len(_kept) < {CAP_MB + 512}:  # 1 MB a string, past the cap; then an endless loop
        _kept.append("x" * 2**20)
    while True:
        pass
"""
    + REST
)
SPINS = "def graph_batch_sizes(max_bs):\n    while True:\n        pass\n" + REST


def _solution(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "mine.py"
    path.write_text(source, encoding="utf-8")
    return path


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Limits of seconds, so that a test whose limit is missing fails soon."""
    monkeypatch.setattr(judge, "TEST_LIMIT_S", {"browser": 2, "local": 2})
    monkeypatch.setattr(judge, "TIMEOUT_S", 20)


@pytest.fixture
def roomy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Time for what should stop at another limit (the cap: it takes < 1 s) on a busy machine;
    without that limit, the test fails on time."""
    monkeypatch.setattr(judge, "TEST_LIMIT_S", {"browser": 20, "local": 20})


def _peak_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_a_runaway_allocation_stops_at_the_cap(roomy: None, tmp_path: Path, capsys) -> None:
    before = _peak_kb()
    status = judge.main(["171", str(_solution(tmp_path, ALLOCATES))])
    lines = capsys.readouterr().out.splitlines()
    assert status == 1
    assert (
        lines[1] == f"FAIL test_small_maxima: used more than {CAP_MB} MB (a list or a loop "
        "that grows without end?)"
    ), lines
    assert (
        lines[2] == "FAIL test_every_maximum_up_to_300: not run: an earlier test used too "
        "much memory"
    )
    assert _peak_kb() - before < 100 * 1024  # it grew in the child, not in this process


def test_the_radix_near_miss_runs_into_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """081's children_by_first_token splits an edge at 0 for ever, each time a node more: the
    near-miss that took a test process from 7 GB to 21 GB. Under a cap of 256 MB (its time
    limit stretched, so that the cap comes first) it fails one test, with the memory's line:
    the runner frees its tree, whose nodes point at each other, to write that line at all."""
    monkeypatch.setattr(judge, "MEMORY_LIMIT_MB", {"browser": 256, "local": 256})
    monkeypatch.setattr(judge, "MEMORY_PER_CORE_MB", 0)  # pure Python: one thread
    monkeypatch.setattr(judge, "TEST_LIMIT_S", {"browser": 15, "local": 15})
    exercise = judge.find("081", PRACTICE)
    near_miss = exercise.folder / "near_misses" / "children_by_first_token.py"
    outcomes, _ = judge.judge(exercise, near_miss)
    failed = [(o.name, o.message) for o in outcomes if not o.passed]
    assert failed[0] == (
        "test_whole_pages_only",
        "used more than 256 MB (a list or a loop that grows without end?)",
    ), failed


def test_a_child_killed_at_the_cap_is_said_to_have_used_too_much(
    roomy: None, tmp_path: Path
) -> None:
    """No MemoryError to catch: the process dies at the cap with no result (as C code that
    gets no memory may abort), and its peak tells the judge why."""
    source = ALLOCATES.replace(
        "    while True:\n        pass\n",
        "    import os, signal\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    )
    source = source.replace(
        '        _kept.append("x" * 2**20)\n',
        "        try:\n"
        '            _kept.append("x" * 2**20)\n'
        "        except MemoryError:\n            break\n",
    )
    outcomes, _ = judge.judge(EXERCISE, _solution(tmp_path, source))
    assert [(o.name, o.passed) for o in outcomes] == [("memory", False)]
    assert (
        outcomes[0].message == f"the tests used more than {CAP_MB} MB (a list or a loop "
        "that grows without end?)"
    )


def test_a_crash_below_the_cap_is_a_crash(quick: None, tmp_path: Path) -> None:
    source = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"
    outcomes, _ = judge.judge(EXERCISE, _solution(tmp_path, source))
    assert [(o.name, o.message) for o in outcomes] == [
        ("runner", "the judge crashed: its process was killed by signal 9")
    ]


def test_an_endless_loop_takes_longer_than_the_limit(quick: None, tmp_path: Path, capsys) -> None:
    status = judge.main(["171", str(_solution(tmp_path, SPINS))])
    lines = capsys.readouterr().out.splitlines()
    assert status == 1
    assert lines[1] == "FAIL test_small_maxima: took longer than 2 s (an endless loop?)"
    assert lines[2] == "FAIL test_every_maximum_up_to_300: not run: an earlier test timed out"


def test_an_endless_loop_at_load_takes_longer_than_the_limit(quick: None, tmp_path: Path) -> None:
    outcomes, _ = judge.judge(EXERCISE, _solution(tmp_path, "while True:\n    pass\n"))
    assert [(o.name, o.message) for o in outcomes] == [
        ("load", "the file does not load: took longer than 2 s (an endless loop?)")
    ]


def test_an_alarm_lost_in_a_finalizer_comes_again(quick: None, tmp_path: Path) -> None:
    """The limit's exception raised inside a __del__ is printed and dropped: were the alarm
    given once, the loop after it would run to the child's timeout (20 s here)."""
    source = (
        "import time\n\nclass _Slow:\n    def __del__(self):\n        time.sleep(3)\n\n"
        "def graph_batch_sizes(max_bs):\n    _Slow()\n    while True:\n        pass\n" + REST
    )
    outcomes, printed = judge.judge(EXERCISE, _solution(tmp_path, source))
    assert outcomes[0].message == "took longer than 2 s (an endless loop?)"
    assert "Exception ignored in" in printed  # the first alarm was lost


def test_a_child_deaf_to_the_alarm_is_killed_after_the_timeout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(judge, "TIMEOUT_S", 1)
    source = "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n" + SPINS
    outcomes, _ = judge.judge(EXERCISE, _solution(tmp_path, source))
    assert [(o.name, o.message) for o in outcomes] == [
        ("timeout", "the tests took longer than 1 s (an endless loop?)")
    ]


def test_what_a_printing_loop_prints_is_cut(roomy: None, tmp_path: Path) -> None:
    source = SPINS.replace("        pass", "        print('x' * 1000)")
    outcomes, printed = judge.judge(EXERCISE, _solution(tmp_path, source))
    assert (
        outcomes[0].message == f"printed more than {runner.OUTPUT_LIMIT_MB} MB (a print "
        "in an endless loop?)"
    )
    assert outcomes[1].message == "not run: an earlier test printed too much"
    assert len(printed) == judge.PRINTED_MAX and set(printed) == {"x", "\n"}  # its last MB


def test_without_the_resource_module_the_tests_run_uncapped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with monkeypatch.context() as patched:
        patched.setitem(sys.modules, "resource", None)  # `import resource` fails, as on Windows
        assert runner.cap_memory(100) is False
    monkeypatch.setattr(judge, "_CAN_CAP", False)
    outcomes, _ = judge.judge(EXERCISE, EXERCISE.file("reference.py"))
    assert runner.all_passed(outcomes)


def test_without_wait4_the_child_still_runs_and_times_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Windows has no os.wait4: subprocess.run instead, with no peak to read."""
    monkeypatch.delattr(os, "wait4")
    assert runner.all_passed(judge.judge(EXERCISE, EXERCISE.file("reference.py"))[0])
    monkeypatch.setattr(judge, "TIMEOUT_S", 1)
    source = "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n" + SPINS
    outcomes, _ = judge.judge(EXERCISE, _solution(tmp_path, source))
    assert [(o.name, o.message) for o in outcomes] == [
        ("timeout", "the tests took longer than 1 s (an endless loop?)")
    ]


def test_torch_is_capped_too(tmp_path: Path) -> None:
    """A failed allocation in torch is a RuntimeError, not a MemoryError; the local exercise's
    tests (042, torch) pass under its cap, which leaves room for torch's import."""
    exercise = judge.find("042", PRACTICE)
    pytest.importorskip("torch")
    reference = exercise.file("reference.py").read_text(encoding="utf-8")
    cap = judge.memory_cap_mb(exercise.runs)
    source = reference + (
        f"\n_kept = []\n\ndef top_k_top_p_filter(*args):\n"
        f"    while len(_kept) < {cap // 64 + 8}:  # past the cap\n"
        f"        _kept.append(torch.ones(2**26, dtype=torch.uint8))\n"
    )
    good, _ = judge.judge(exercise, exercise.file("reference.py"))
    assert runner.all_passed(good), [o for o in good if not o.passed]
    outcomes, _ = judge.judge(exercise, _solution(tmp_path, source))
    failed = [o for o in outcomes if not o.passed]
    assert failed and failed[0].message.endswith(GROWS), failed[0].message
    assert failed[0].message.startswith(f"used more than {cap} MB")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc (Linux)")
def test_the_cap_is_on_the_childs_data(tmp_path: Path) -> None:
    """What the child is capped at, read from the child itself."""
    source = (
        "def graph_batch_sizes(max_bs):\n    import resource\n"
        "    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)\n"
        "    raise AssertionError(f'cap {soft // 2**20}')\n" + REST
    )
    outcomes, _ = judge.judge(EXERCISE, _solution(tmp_path, source))
    assert outcomes[0].message == f"cap {CAP_MB}"


def test_judge_many_gives_what_judge_gives(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One child for them all, the runaways among them included, until one kills it: that one
    and those after it are judged each on its own."""
    monkeypatch.setattr(judge, "TEST_LIMIT_S", {"browser": 6, "local": 6})  # > ALLOCATES'
    monkeypatch.setattr(judge, "TIMEOUT_S", 60)
    sources = {
        "wrong": "def graph_batch_sizes(max_bs):\n    return [1]\n" + REST,
        "allocates": ALLOCATES,
        "spins": SPINS,
        "killed": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    }
    paths = {}
    for name, source in sources.items():
        paths[name] = tmp_path / f"{name}.py"
        paths[name].write_text(source, encoding="utf-8")
    reference = EXERCISE.file("reference.py")
    solutions = [
        reference,
        paths["wrong"],
        paths["allocates"],
        paths["spins"],
        paths["killed"],
        reference,
    ]
    alone = [judge.judge(EXERCISE, path)[0] for path in solutions]
    judged_alone = []
    one = judge.judge
    monkeypatch.setattr(judge, "judge", lambda e, path: judged_alone.append(path) or one(e, path))
    assert judge.judge_many(EXERCISE, solutions) == alone
    assert judged_alone == [paths["killed"], reference]  # the four before it: in one child
    assert alone[2][0].message.startswith("used more than")
    assert alone[3][0].message.startswith("took longer than")
    assert runner.all_passed(alone[0]) and runner.all_passed(alone[5])


def test_a_crash_is_a_crash_when_the_judge_itself_is_large(quick: None, tmp_path: Path) -> None:
    """A forked child's ru_maxrss counts the parent's memory at the fork: judged from a large
    process (pytest running every test, steps.py's warm Python), every crash and timeout once
    looked like a child at its memory cap."""
    ballast = b"x" * (CAP_MB * 2**20)  # written, so resident: this process is above the cap
    source = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"
    outcomes, _ = judge.judge(EXERCISE, _solution(tmp_path, source))
    assert len(ballast) and [(o.name, o.message) for o in outcomes] == [
        ("runner", "the judge crashed: its process was killed by signal 9")
    ]
