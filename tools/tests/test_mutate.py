"""tools/mutate.py: the mutants it makes, and the file it always puts back."""

from pathlib import Path

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
        (7, "3 -> 4"), (7, "3 -> 2"),  # the default
        (9, "0 -> 1"), (9, "0 -> -1"), (9, "statement deleted"),
        (10, "slice lower bound +1"), (10, "slice lower bound -1"),
        (11, "< -> <="), (11, "and -> or"), (11, "not dropped"), (11, "== -> !="),
        (11, "2 -> 3"), (11, "2 -> 1"),
        (12, "+= -> -="), (12, "* -> //"), (12, "2 -> 3"), (12, "2 -> 1"),
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


def test_a_file_a_later_chapter_adds_is_left_out_by_default_and_tested_by_its_chapter(tmp_path):
    repo = small_repo(tmp_path / "repo")
    (repo / "python" / "minisgl" / "llm" / "server.py").write_text("x = 1\n")
    (repo / "steps.yaml").write_text(
        "stages:\n  - chapters:\n"
        "      - {id: ch10, new: [minisgl/llm/llm.py]}\n"
        "      - {id: ch12, new: [minisgl/llm/server.py], modified: [minisgl/llm/llm.py]}\n")
    assert mutate.target_files([], repo) == [Path("python/minisgl/llm/llm.py")]
    assert mutate.chapters_of(Path("python/minisgl/llm/server.py"), repo) == ("ch10", "ch12")
    assert mutate.chapters_of(Path("python/minisgl/llm/llm.py"), repo) == ("ch10", "ch12")


def test_a_mutant_knows_the_first_line_of_its_statement():
    source = "ok = (a\n      and b)\nif (x\n        or y):\n    z = [i for i in\n         y]\n"
    where = {(m.line, m.kind): m.statement for m in mutate.mutants_of(source, "s.py")}
    assert where[(2, "and -> or")] == 1 and where[(4, "or -> and")] == 3
    assert where[(5, "statement deleted")] == 5
