"""tools/mutate.py: the mutants it makes, the file it always puts back, the chapters that test
each file, the sample and the processes it leaves none of."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import bookmaker
import mutate
import pytest

SOURCE = '''\
"""A docstring: no mutant here."""
import abc

__all__ = ["f"]


def f(xs: list[int], n: int = 3) -> int:  # the annotations are no behaviour
    """Nor here."""
    total = 0
    for x in xs[n:]:
        if x < n and not x == 2:
            total += x * 2
    print(total)
    return total


class Base(abc.ABC):
    @abc.abstractmethod
    def g(self, flag: bool = False) -> None: ...


def h(x):
    assert x < 1 and not x, "an invariant the code keeps"
'''


def kinds(mutants):
    return {(m.line, m.kind) for m in mutants}


def test_every_kind_of_mutant_is_made_where_it_should_be():
    mutants = mutate.mutants_of(SOURCE, "f.py")
    assert kinds(mutants) == {
        (7, "3 -> 4"),
        (7, "3 -> 2"),  # the default
        (9, "0 -> 1"),
        (9, "0 -> -1"),
        (9, "statement deleted"),
        (10, "slice lower bound +1"),
        (10, "slice lower bound -1"),
        (11, "< -> <="),
        (11, "and -> or"),
        (11, "not dropped"),
        (11, "== -> !="),
        (11, "2 -> 3"),
        (11, "2 -> 1"),
        (12, "+= -> -="),
        (12, "* -> //"),
        (12, "2 -> 3"),
        (12, "2 -> 1"),
        (12, "statement deleted"),
        (13, "statement deleted"),
        (14, "return value -> None"),
    }  # nothing in docstrings, annotations, __all__, an abstract method's signature or an assert


def test_a_mutant_changes_only_its_own_line_and_compiles():
    original = SOURCE.splitlines()
    for m in mutate.mutants_of(SOURCE, "f.py"):
        lines = m.source.splitlines()
        assert len(lines) == len(original)
        assert [i + 1 for i, (a, b) in enumerate(zip(original, lines)) if a != b] == [m.line]
        compile(m.source, "f.py", "exec")
    by_kind = {(m.line, m.kind): m.mutated_line for m in mutate.mutants_of(SOURCE, "f.py")}
    assert by_kind[(11, "not dropped")] == "if x < n and x == 2:"
    assert by_kind[(10, "slice lower bound +1")] == "for x in xs[(n) + 1:]:"
    assert by_kind[(12, "statement deleted")] == "pass"


def test_a_statement_of_several_lines_deleted_keeps_the_lines_after_it_in_place():
    source = "x = f(1,\n      2)\ny = 3\n"
    deleted = [m for m in mutate.mutants_of(source, "s.py") if m.kind == "statement deleted"]
    assert deleted[0].source == "pass\n\ny = 3\n"


def test_positions_count_characters_not_utf8_bytes():
    source = 'label = "é·—"; y = 1 + 2\n'
    (plus,) = [m for m in mutate.mutants_of(source, "u.py") if m.kind == "+ -> -"]
    assert plus.source == 'label = "é·—"; y = 1 - 2\n'


def small_repo(root: Path) -> Path:
    package = root / "python" / "minisgl" / "llm"
    package.mkdir(parents=True)
    (package / "llm.py").write_text("def one():\n    return 1\n")
    for folder in ("tests", "examples"):
        (root / folder).mkdir()
        (root / folder / "x.py").write_text("")
    (root / "pyproject.toml").write_text("")
    return root


def test_the_mutated_file_is_put_back_even_when_the_tests_crash(tmp_path):
    repo, workdir = small_repo(tmp_path / "repo"), tmp_path / "work"
    mutate.prepare_workdir(workdir, repo)
    file = "python/minisgl/llm/llm.py"
    (mutant, *_) = mutate.mutants_of((workdir / file).read_text(), file)
    seen = []

    def crash() -> str:
        seen.append((workdir / file).read_text())
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        mutate.run_mutant(workdir, mutant, crash)
    assert seen == [mutant.source]  # the tests saw the mutant ...
    assert (workdir / file).read_text() == (repo / file).read_text()  # ... and it is gone
    assert mutate.unchanged_in_git(workdir)
    (workdir / file).write_text(mutant.source)  # and a file left mutated would be seen
    assert not mutate.unchanged_in_git(workdir)


def test_the_repository_itself_is_refused_as_workdir():
    with pytest.raises(SystemExit, match="outside the repository"):
        mutate.main(["--workdir", str(mutate.ROOT / "build" / "mut"), "python/minisgl/llm"])


def test_the_copy_is_what_the_tests_import(tmp_path):
    repo, workdir = small_repo(tmp_path / "repo"), tmp_path / "work"
    (repo / "python" / "minisgl" / "__init__.py").write_text("")
    mutate.prepare_workdir(workdir, repo)
    mutate.check_imports_the_copy(workdir)  # passes: PYTHONPATH names the copy
    (workdir / "python" / "minisgl" / "__init__.py").unlink()  # now only an installed one
    with pytest.raises(SystemExit, match="not from the copy"):
        mutate.check_imports_the_copy(workdir)


def toy_engine_book(root: Path) -> Path:
    """A valid book (tools/stepslib loads it) of a package minisgl in three chapters.

    ch01 adds core.py and a/ (whose __init__ re-exports a/impl.py); ch02 adds b/b.py and changes
    core.py; ch03 adds c.py and its tests import minisgl.a (so a/impl.py too, re-exported) and,
    inside a function, minisgl.b.b; ch01's tests import only minisgl.core.
    """
    files = {
        "python/minisgl/__init__.py": "",
        "chapters/ch01_one/python/minisgl/core.py": "X = 1\n",
        "python/minisgl/core.py": "X = 2\n",
        "python/minisgl/a/__init__.py": "from .impl import f\n",
        "python/minisgl/a/impl.py": "def f():\n    return 1\n",
        "python/minisgl/b/b.py": "def g():\n    return 2\n",
        "python/minisgl/c.py": "Y = 3\n",
        "tests/test_ch01_one.py": "from minisgl.core import X\n",
        "tests/test_ch02_two.py": "",
        "tests/test_ch03_three.py": (
            "from minisgl.a import f\n\n\ndef test_g():\n    import minisgl.b.b\n"
        ),
    }
    for n, slug in ((1, "one"), (2, "two"), (3, "three")):
        files[f"examples/ch{n:02d}_{slug}.py"] = ""
    bookmaker.write_files(root, files)
    bookmaker.write_steps(
        root,
        [
            {
                "title": "Toy",
                "chapters": [
                    bookmaker.chapter(
                        1,
                        "one",
                        new=[
                            "minisgl/__init__.py",
                            "minisgl/core.py",
                            "minisgl/a/__init__.py",
                            "minisgl/a/impl.py",
                        ],
                    ),
                    bookmaker.chapter(
                        2, "two", new=["minisgl/b/b.py"], modified=["minisgl/core.py"]
                    ),
                    bookmaker.chapter(
                        3,
                        "three",
                        new=["minisgl/c.py"],
                        tests=["tests/test_ch03_three.py", "tests/test_ch02_two.py"],
                    ),
                ],
            }
        ],
    )
    return root


def test_a_files_chapters_are_those_that_write_it_and_those_whose_tests_import_it(tmp_path):
    repo = toy_engine_book(tmp_path / "book")
    chapters = lambda f: mutate.chapters_of(Path("python/minisgl") / f, repo)  # noqa: E731
    assert chapters("core.py") == ("ch01", "ch02")  # new, modified; ch01's tests import it
    assert chapters("a/__init__.py") == ("ch01", "ch03")  # imported by ch03's tests
    assert chapters("a/impl.py") == ("ch01", "ch03")  # re-exported by a/__init__.py
    assert chapters("b/b.py") == ("ch02", "ch03")  # imported inside a test function
    assert chapters("c.py") == ("ch03",)  # no test imports it
    # a chapter's tests are those steps.yaml lists, however they are named
    assert mutate.tests_of(("ch03",), repo) == [
        "tests/test_ch02_two.py",
        "tests/test_ch03_three.py",
    ]
    assert mutate.tests_of(("ch01", "ch02"), repo) == [
        "tests/test_ch01_one.py",
        "tests/test_ch02_two.py",
    ]


def test_every_file_of_every_package_is_a_target_by_default(tmp_path):
    repo = toy_engine_book(tmp_path / "book")
    assert [f.as_posix() for f in mutate.target_files([], repo)] == [
        "python/minisgl/a/__init__.py",
        "python/minisgl/a/impl.py",
        "python/minisgl/b/b.py",
        "python/minisgl/__init__.py",
        "python/minisgl/c.py",
        "python/minisgl/core.py",
    ]
    assert [mutate.package_of(f) for f in mutate.target_files([], repo)] == [
        "a",
        "a",
        "b",
        "root",
        "root",
        "root",
    ]
    with pytest.raises(SystemExit, match="not a .py file"):
        mutate.target_files(["tests/test_ch01_one.py"], repo)


def test_the_real_books_files_are_tested_by_their_chapters():
    """On this book: the chapters that add or change a file, and those that import it."""

    def chapters(name: str) -> set[str]:
        return set(mutate.chapters_of(Path("python/minisgl") / name))

    assert {"ch04", "ch15", "ch18", "ch23"} <= chapters("engine/sample.py")  # its writes
    assert {"ch04", "ch05", "ch16", "ch17", "ch18", "ch23", "ch24"} <= chapters("core.py")
    assert "ch10" in chapters("llm/llm.py") and "ch13" in chapters("llm/llm.py")  # imports
    assert "ch08" in chapters("kvcache/radix_cache.py")
    assert "ch01" not in chapters("server/api_server.py")
    assert "tests/test_ch22_shapes.py" in mutate.tests_of(["ch22"])  # all three of ch22's
    defaults = {f.as_posix() for f in mutate.target_files([])}
    for name in (
        "core.py",
        "env.py",
        "shell.py",
        "__main__.py",
        "server/api_server.py",
        "models/decoder.py",
        "layers/linear.py",
        "speculative/ngram.py",
        "structured/grammar.py",
        "tokenizer/detokenize.py",
    ):
        assert f"python/minisgl/{name}" in defaults


def fake_mutants(n: int, path: str = "p.py") -> list:
    return [
        mutate.Mutant(path, i // 3 + 1, f"kind {i % 3}", f"line {i}\n" * (i // 3 + 1))
        for i in range(n)
    ]


def test_a_sample_is_reproducible_and_the_seed_chooses_it():
    mutants = fake_mutants(60)
    a, b = mutate.sample(mutants, 10), mutate.sample(list(mutants), 10)
    assert len(a) == 10 and a == b  # the same seed, the same sample
    assert a == [m for m in mutants if m in a]  # in the order of the file
    assert mutate.sample(mutants, 10, seed=1) != a
    assert mutate.sample(mutants, 100) == mutants and mutate.sample(mutants, None) == mutants
    # a mutant's rank is its own: mutants added elsewhere move it only by the ones they add
    more = mutate.sample(mutants + fake_mutants(60, "q.py"), 20)
    assert {m.key for m in more if m.path == "p.py"} <= {m.key for m in mutate.sample(mutants, 20)}


def test_list_with_a_sample_prints_that_many_mutants_of_each_package(capsys):
    argv = [
        "--list",
        "--sample",
        "4",
        "python/minisgl/engine",
        "python/minisgl/core.py",
        "python/minisgl/env.py",
    ]
    assert mutate.main(argv) == 0
    first = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("python/minisgl/engine/") for line in first) == 4
    assert (
        sum(line.startswith(("python/minisgl/core.py", "python/minisgl/env.py")) for line in first)
        == 4
    )
    mutate.main(argv)
    assert capsys.readouterr().out.splitlines() == first


def test_the_summary_table_counts_each_package():
    rows = {
        "engine": [
            {"status": s} for s in ["killed"] * 6 + ["timeout", "survived", "not covered", "killed"]
        ],
        "root": [{"status": "survived"}, {"status": "killed"}],
    }
    table = mutate.summary_table(rows, {"engine": 40, "root": 2}).splitlines()
    assert table[2] == "| `engine` | 10 | 40 | 8 | 1 | 1 | 1 | 80.0% |"
    assert table[3] == "| `root` | 2 | 2 | 1 | 0 | 1 | 0 | 50.0% |"
    assert table[4] == "| all | 12 | 42 | 9 | 1 | 2 | 1 | 75.0% |"


KILLS = """
import os, sys, time
from pathlib import Path
import mutate
mutate._set_subreaper()
log = Path(sys.argv[1])
script = "setsid sleep 300 & echo $!; exec sleep 300"
# cut off by its timeout: the group and the child that left it in a session of its own
done = mutate._run_group(["bash", "-c", script], ".", dict(os.environ), 3, log)
# ended by itself, an orphan left behind in a session of its own
left = mutate._run_group(["bash", "-c", "setsid sleep 300 & echo $!"], ".", dict(os.environ),
                         30, log)


def alive(pid):  # a killed orphan is this subreaper's zombie until reaped: reap first
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


pids = [int(out.split()[0]) for out in (done.stdout, left.stdout)]
deadline = time.monotonic() + 10  # a loaded machine delivers the kill late; never 300 s
while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
    time.sleep(0.05)
for pid in pids:
    print("ALIVE" if alive(pid) else "gone", pid)
"""


def test_what_a_run_leaves_running_is_killed_even_outside_its_group(tmp_path):
    """In a process of its own: a subreaper and a reaper of every child are no things to make
    of pytest's process."""
    tools = Path(mutate.__file__).parent
    done = subprocess.run(
        [sys.executable, "-c", KILLS, str(tmp_path / "log")],
        cwd=tools,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("gone") == 2, done.stdout


def test_a_mutant_knows_the_first_line_of_its_statement():
    source = "ok = (a\n      and b)\nif (x\n        or y):\n    z = [i for i in\n         y]\n"
    where = {(m.line, m.kind): m.statement for m in mutate.mutants_of(source, "s.py")}
    assert where[(2, "and -> or")] == 1 and where[(4, "or -> and")] == 3
    assert where[(5, "statement deleted")] == 5


def test_a_fixtures_lines_choose_every_test_of_its_module_and_a_tests_lines_that_test():
    """A line run in a test's setup (a server a fixture starts for the whole module) may matter
    to every test of the module; one run by the test itself, to that test; failing tests and
    other chapters' tests are never chosen."""
    baseline = mutate.Baseline(
        tests_hash="",
        durations={
            "tests/t.py::a": 1.0,
            "tests/t.py::b": 0.5,
            "tests/t.py::broken": 0.1,
            "tests/u.py::c": 0.1,
        },
        setups={},
        lines={
            "p.py": {"5": ["tests/t.py::a|setup"], "6": ["tests/t.py::a"], "7": ["tests/u.py::c"]}
        },
        imported={},
        failing=["tests/t.py::broken"],
    )

    def tests(line: int) -> list[str] | None:
        return mutate.tests_for(
            mutate.Mutant("p.py", line, "k", "", line), baseline, ["tests/t.py"]
        )

    assert tests(5) == ["tests/t.py::b", "tests/t.py::a"]  # fastest first
    assert tests(6) == ["tests/t.py::a"]
    assert tests(7) is None and tests(8) is None  # another chapter's test; no test


def test_report_tables_the_results_kept_and_runs_nothing(tmp_path, capsys):
    file = "python/minisgl/utils/misc.py"
    mutants = mutate.sample(mutate.mutants_of((mutate.ROOT / file).read_text(), file), 3)
    (tmp_path / ".mutate").mkdir()
    rows = [{"key": m.key, "status": s} for m, s in zip(mutants, ["killed", "survived"])]
    (tmp_path / ".mutate" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert mutate.main(["--report", "--sample", "3", "--workdir", str(tmp_path), file]) == 0
    out = capsys.readouterr().out
    assert "utils: 1 mutants not run yet" in out
    assert "| `utils` | 2 | " in out and "| 1 | 0 | 1 | 0 | 50.0% |" in out
