"""`steps.py check` verifies each chapter's practice exercises, a column of its table, in
`--static` mode too; a toy book with the real practice/judge.py and runner.py and one
exercise of its own."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from bookmaker import steps, write_files

REPO = Path(__file__).resolve().parents[2]
EXERCISE = "practice/021_shout"
TOML = """id = "021"
title = "Shouting"
chapter = 2
difficulty = "easy"
runs = "browser"
function = "shout"
source = "python/toy/shout.py"
"""
FILES = {
    f"{EXERCISE}/exercise.toml": TOML,
    f"{EXERCISE}/README.md": "# 021 · Shouting (easy)\n\nWrite `shout(name)`.\n",
    f"{EXERCISE}/starter.py": "def shout(name):\n    raise NotImplementedError\n",
    f"{EXERCISE}/reference.py": "def shout(name):\n    return ('hello, ' + name + '!').upper()\n",
    f"{EXERCISE}/tests.py": "def test_shout(solution):\n"
    "    assert solution.shout('a') == 'HELLO, A!', 'shout a'\n",
}


@pytest.fixture
def practised(book: Path) -> Path:
    for name in ("judge.py", "runner.py"):
        (book / "practice").mkdir(exist_ok=True)
        shutil.copy(REPO / "practice" / name, book / "practice" / name)
    write_files(book, FILES)
    return book


def _rows(stdout: str) -> dict[str, list[str]]:
    """The table's cells by chapter (cells are two spaces apart, and hold single spaces)."""
    lines = stdout.splitlines()
    assert re.split(r"\s{2,}", lines[0])[-2:] == ["practice", "result"], lines[0]
    return {
        line.split()[0]: re.split(r"\s{2,}", line) for line in lines[2:] if line.startswith("ch")
    }


def test_a_sound_exercise_is_a_column_of_the_table(practised: Path) -> None:
    done = steps(practised, "check", "--static")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _rows(done.stdout)
    assert rows["ch02"][-2:] == ["1 ok", "pass"]
    assert rows["ch01"][-2:] == ["-", "pass"]  # a chapter without exercises is not a failure


def test_the_full_check_verifies_them_too(practised: Path) -> None:
    done = steps(practised, "check", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _rows(done.stdout)["ch02"][-2:] == ["1 ok", "pass"]


@pytest.mark.parametrize(
    "name, text, problem",
    [
        ("starter.py", FILES[f"{EXERCISE}/reference.py"], ": the starter passes the tests"),
        (
            "reference.py",
            "def shout(name):\n    return name\n",
            ": the reference fails test_shout: shout a",
        ),
        (
            "README.md",
            "# Shouting\n",
            ": README.md begins '# Shouting', not '# 021 · Shouting (easy)'",
        ),
        (
            "exercise.toml",
            TOML.replace("chapter = 2", "chapter = 3"),
            "/exercise.toml: chapter is 3, but id 021 says 2",
        ),
        ("tests.py", None, ": tests.py is missing"),
    ],
)
def test_a_broken_exercise_fails_its_chapter(
    practised: Path, name: str, text: str | None, problem: str
) -> None:
    assert steps(practised, "check", "--static").returncode == 0  # cached as passing
    path = practised / EXERCISE / name
    path.unlink() if text is None else path.write_text(text)
    done = steps(practised, "check", "--static")  # the cache must see the change
    assert done.returncode == 1
    rows = _rows(done.stdout)
    assert rows["ch02"][-1] == "fail" and rows["ch01"][-1] == "pass (cached)"
    assert f"── ch02_shout · practice: 1 wrong ──\n{EXERCISE}{problem}\n" in done.stdout


def test_a_changed_judge_reruns_the_check(practised: Path) -> None:
    assert steps(practised, "check", "--static").returncode == 0
    judge = practised / "practice" / "judge.py"
    judge.write_text(judge.read_text() + "\n# edited\n")
    assert "(cached)" not in _rows(steps(practised, "check", "2", "--static").stdout)["ch02"]


def test_two_folders_for_one_exercise_fail_the_chapter(practised: Path) -> None:
    shutil.copytree(practised / EXERCISE, practised / "practice" / "021_again")
    done = steps(practised, "check", "--static")
    assert done.returncode == 1
    assert "two folders for exercise 021" in done.stdout
