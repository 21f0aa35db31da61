"""The tests of the exercises' tests: each `practice/NNN_slug/near_misses/*.py` is a solution
that is right except for one sentence of the statement (its docstring, "Breaks: ...", quotes
that sentence), and the judge must reject every one, while the reference passes. Each is
judged in a child process with the judge's time limit and memory cap (`judge.judge_many`: one
child for an exercise's solutions, whose tests may import torch): a near-miss that runs away
(081's children_by_first_token loops, growing the tree) is cut off there, not in this process."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRACTICE = REPO / "practice"


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


judge = _module("practice_judge_for_near_misses", PRACTICE / "judge.py")
runner = judge.runner
EXERCISES = judge.exercises(PRACTICE)


def _near_misses(exercise) -> list[Path]:
    return sorted((exercise.folder / "near_misses").glob("*.py"))


def _says_what_it_breaks(path: Path) -> bool:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    return doc is not None and doc.startswith("Breaks: ") and "\n" not in doc


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.folder.name)
def test_the_judge_rejects_every_near_miss(exercise) -> None:
    near_misses = _near_misses(exercise)
    assert near_misses, f"{exercise.folder.name} has no near_misses/*.py"
    unsaid = [p.name for p in near_misses if not _says_what_it_breaks(p)]
    assert not unsaid, f"no one-line 'Breaks: ...' docstring: {unsaid}"
    solutions = [exercise.file("reference.py"), *near_misses]
    reference, *judged = judge.judge_many(exercise, solutions)
    assert runner.all_passed(reference), [o for o in reference if not o.passed]
    passed = [p.name for p, outcomes in zip(near_misses, judged) if runner.all_passed(outcomes)]
    assert not passed, f"{exercise.folder.name}: the judge passes near-misses {passed}"


def test_every_exercise_is_here() -> None:
    """27 exercises when this was written: a new one is parametrized above without a change."""
    assert len(EXERCISES) >= 27
