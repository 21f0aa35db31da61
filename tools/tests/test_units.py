"""The tool's modules on their own: selection, print comparison, the closure check, symbols."""

from pathlib import Path

import pytest
from bookmaker import write_files
from stepslib.book import load_book, parse_selection
from stepslib.errors import BookError
from stepslib.imports import Closure
from stepslib.render import directives, find_symbol
from stepslib.runner import same_prints


def test_selection_forms(book):
    loaded = load_book(book)
    ids = lambda text: [c.id for c in parse_selection(loaded, text)]  # noqa: E731
    assert ids(None) == ["ch01", "ch02", "ch03"]
    assert ids("2") == ids("02") == ids("ch02") == ids("ch2") == ids("ch02_shout") == ["ch02"]
    assert ids("ch01_greet-3") == ["ch01", "ch02", "ch03"]
    assert ids("1-2") == ids("ch01-ch02") == ["ch01", "ch02"]
    assert ids("3,1") == ["ch01", "ch03"]
    assert ids("1-3,2") == ["ch01", "ch02", "ch03"]
    with pytest.raises(BookError, match="no chapter 4"):
        parse_selection(loaded, "2-4")


@pytest.mark.parametrize(
    "recorded, printed, tolerance, same",
    [
        ("max error 2.4e-07\n", "max error 2.4e-07\n", None, True),
        ("max error 2.4e-07\n", "max error 3.1e-07\n", None, False),
        ("max error 2.4e-07\n", "max error 3.1e-07\n", 1e-6, True),
        ("max error 2.4e-07\n", "max error 2.4e-05\n", 1e-6, False),
        ("ids [1, 2, 3]\n", "ids [1, 2, 4]\n", 1e-6, False),
        ("a 1.0\n", "b 1.0\n", 1e-6, False),
        ("a 1.0\n", "a 1.0 2.0\n", 1e-6, False),
        ("x -0.5\n", "x -0.5000001\n", 1e-6, True),
    ],
)
def test_same_prints(recorded, printed, tolerance, same):
    assert same_prints(recorded, printed, tolerance) is same


def _closure(tmp_path: Path, files: dict[str, str]) -> Closure:
    write_files(tmp_path, files)
    sources = {p: tmp_path / p for p in files}
    return Closure(sources, {s: p for p, s in sources.items()})


def _problems(closure: Closure, tmp_path: Path, path: str, module: str, chapter: int = 1):
    problems, forwards = closure.check(tmp_path / path, module, chapter)
    return [str(p) for p in problems], forwards


def test_closure_resolves_relative_star_and_nested_imports(tmp_path):
    closure = _closure(
        tmp_path,
        {
            "pkg/__init__.py": "from .a import A\n",
            "pkg/a.py": "try:\n    import json\nexcept ImportError:\n    json = None\nA = 1\n"
            "if A:\n    def helper():\n        pass\n",
            "pkg/sub/__init__.py": "from ..a import *\n",
            "pkg/sub/b.py": "from . import c\nfrom .. import a\nfrom ..a import helper, json\n"
            "import pkg.sub.c\nimport os\n\n\ndef f():\n    from pkg.sub import A\n",
            "pkg/sub/c.py": "",
        },
    )
    assert _problems(closure, tmp_path, "pkg/sub/b.py", "pkg.sub.b") == ([], [])
    assert _problems(closure, tmp_path, "pkg/__init__.py", "pkg") == ([], [])


def test_closure_finds_missing_modules_and_names(tmp_path):
    closure = _closure(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from .b import nothing\n\n\ndef f():\n    from pkg.b import g\n"
            "    import pkg.c.d\n",
            "pkg/b.py": "def h():\n    pass\n",
        },
    )
    problems, _ = _problems(closure, tmp_path, "pkg/a.py", "pkg.a")
    assert problems == [
        "pkg/a.py:1: `from pkg.b import nothing`: pkg.b has no name 'nothing' in this tree",
        "pkg/a.py:5: `from pkg.b import g`: pkg.b has no name 'g' in this tree",
        "pkg/a.py:6: `import pkg.c.d`: no module pkg.c in this tree",
    ]


def test_closure_forward_reference_on_a_multi_line_import(tmp_path):
    closure = _closure(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "def f():\n    from pkg.later import (\n        x,\n"
            "    )  # forward reference: ch07\n",
        },
    )
    problems, forwards = _problems(closure, tmp_path, "pkg/a.py", "pkg.a", chapter=3)
    assert problems == [] and [(f.module, f.chapter) for f in forwards] == [("pkg.later", 7)]
    problems, forwards = _problems(closure, tmp_path, "pkg/a.py", "pkg.a", chapter=7)
    assert problems and not forwards


def test_closure_reports_a_syntax_error(tmp_path):
    closure = _closure(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "def f(:\n"})
    problems, _ = _problems(closure, tmp_path, "pkg/a.py", "pkg.a")
    assert problems == ["pkg/a.py:1: syntax error: invalid syntax"]


def test_find_symbol_takes_decorators_and_methods():
    text = (
        "import x\n\n\n@x.jit\ndef kernel(a):\n    return a\n\n\nclass C:\n"
        "    def m(self):\n        return 1\n\n    def n(self):\n        pass\n"
    )
    assert find_symbol(text, "kernel", "f.py") == "@x.jit\ndef kernel(a):\n    return a\n"
    assert find_symbol(text, "C.m", "f.py") == "def m(self):\n    return 1\n"
    with pytest.raises(BookError, match="f.py has no C.z"):
        find_symbol(text, "C.z", "f.py")


def test_find_symbol_takes_an_assignment_to_a_name():
    text = "TILES = {\n    'a': 1,  # why\n}\nx: int = 3\nY = TILES\n\n\nclass C:\n    SIZE = 4\n"
    assert find_symbol(text, "TILES", "f.py") == "TILES = {\n    'a': 1,  # why\n}\n"
    assert find_symbol(text, "x", "f.py") == "x: int = 3\n"
    assert find_symbol(text, "C.SIZE", "f.py") == "SIZE = 4\n"
    with pytest.raises(BookError, match="f.py has no TILES.a"):
        find_symbol(text, "TILES.a", "f.py")


def test_directives_outside_fences_only():
    text = "@[tree]\n```\n@[main]\n```\n@[code](a.py · f)\n  @[prints]\n"
    assert directives(text) == [(1, "tree", ""), (5, "code", "a.py · f")]
