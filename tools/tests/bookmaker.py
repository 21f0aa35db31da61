"""Small synthetic books for the steps tool's own tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

STEPS = Path(__file__).resolve().parents[1] / "steps.py"
REPO = Path(__file__).resolve().parents[2]
# What the steps tool reads of this repository's book: a copy of them is a book it can check
BOOK_PARTS = ("steps.yaml", "pyproject.toml", "python", "chapters", "examples", "tests")


def write_files(root: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def write_steps(
    root: Path, stages: list[dict], support: list[str] | None = None, package_root: str = "python"
) -> None:
    data = {
        "title": "A toy book",
        "package_root": package_root,
        "support": support or [],
        "stages": stages,
    }
    (root / "steps.yaml").write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def steps(root: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run the tool on the book at `root`, as a user would."""
    return subprocess.run(
        [sys.executable, str(STEPS), "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def chapter(number: int, slug: str, new=(), modified=(), early=(), **extra) -> dict:
    entry = {
        "id": f"ch{number:02d}",
        "slug": slug,
        "title": f"Chapter {number}",
        "main": f"examples/ch{number:02d}_{slug}.py",
        "tests": [f"tests/test_ch{number:02d}_{slug}.py"],
        "new": list(new),
        "modified": list(modified),
        "early": list(early),
        "requires": "cpu",
    }
    entry.update(extra)
    return entry


def toy_book(root: Path) -> Path:
    """Three chapters of a package `toy`: added, modified and early files, imports across them.

    ch01 adds toy/__init__.py and toy/greet.py; ch02 adds toy/shout.py (using greet), modifies
    greet.py and brings in ch03's toy/count.py early; ch03 adds count.py as its own.
    """
    files = {
        "python/toy/__init__.py": '"""A toy package."""\n',
        "chapters/ch01_greet/python/toy/greet.py": (
            'def greet(name: str) -> str:\n    return "hello " + name\n'
        ),
        "python/toy/greet.py": 'def greet(name: str) -> str:\n    return "hello, " + name + "!"\n',
        "python/toy/shout.py": "from toy.greet import greet\n\n\ndef shout(name: str) -> str:\n"
        "    return greet(name).upper()\n",
        "python/toy/count.py": "def count(text: str) -> int:\n    return len(text.split())\n",
        "examples/ch01_greet.py": "from toy.greet import greet\n\nprint(greet('world'))\n",
        "examples/ch02_shout.py": "from toy.shout import shout\nfrom toy.count import count\n\n"
        "print(shout('world'))\nprint(count('a b c'))\n",
        "examples/ch03_count.py": "from toy.count import count\n\nprint(count('one two'))\n",
        "tests/helpers.py": "def words(text):\n    return text.split()\n",
        "tests/test_ch01_greet.py": "from toy.greet import greet\n\n\ndef test_greet():\n"
        "    assert 'world' in greet('world')\n",
        "tests/test_ch02_shout.py": "from toy.shout import shout\n\n\ndef test_shout():\n"
        "    assert shout('a') == 'HELLO, A!'\n",
        "tests/test_ch03_count.py": "from helpers import words\nfrom toy.count import count\n\n\n"
        "def test_count():\n    assert count('x y') == len(words('x y')) == 2\n",
        "chapters/ch01_greet/main.out": "hello world\n",
        "chapters/ch02_shout/main.out": "HELLO, WORLD!\n3\n",
        "chapters/ch03_count/main.out": "2\n",
        "chapters/ch01_greet/README.md": (
            "# Greet\n\n@[tree]\n\n`toy/__init__.py` is empty.\n\n@[code](toy/greet.py · greet)\n\n"
            "@[main]\n\n@[prints]\n"
        ),
        "chapters/ch02_shout/README.md": "# Shout\n\n@[code](toy/shout.py)\n\n"
        "@[code](toy/greet.py · greet)\n\n"
        "@[test](tests/test_ch02_shout.py · test_shout)\n",
        "chapters/ch03_count/README.md": "# Count\n\n@[code](toy/count.py)\n",
    }
    write_files(root, files)
    write_steps(
        root,
        [
            {
                "title": "Stage 1",
                "chapters": [
                    chapter(1, "greet", new=["toy/__init__.py", "toy/greet.py"]),
                    chapter(
                        2,
                        "shout",
                        new=["toy/shout.py"],
                        modified=["toy/greet.py"],
                        early=["toy/count.py"],
                    ),
                ],
            },
            {"title": "Stage 2", "chapters": [chapter(3, "count", new=["toy/count.py"])]},
        ],
        support=["tests/helpers.py"],
    )
    return root


def copy_real_book(root: Path) -> Path:
    """A copy of this repository's book at `root` (package, stored versions, mains, tests,
    steps.yaml), to edit without touching the repository."""
    import shutil

    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    root.mkdir(parents=True, exist_ok=True)
    for part in BOOK_PARTS:
        source = REPO / part
        if source.is_dir():
            shutil.copytree(source, root / part, ignore=ignore)
        else:
            shutil.copyfile(source, root / part)
    return root
