"""The engine's layers: steps.yaml's `layers`, checked by `check --static` on every tree."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml
from bookmaker import copy_real_book, steps
from stepslib.book import load_book

REPO = Path(__file__).resolve().parents[2]


def _layered(book: Path, layers: list) -> None:
    data = yaml.safe_load((book / "steps.yaml").read_text(encoding="utf-8"))
    data["layers"] = layers
    (book / "steps.yaml").write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def _static(book: Path):
    return steps(book, "check", "--static", "--no-cache")


def test_imports_down_the_layers_pass(book):
    _layered(book, [["greet", "count"], "shout"])  # shout imports greet
    done = _static(book)
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_import_up_the_layers_fails_naming_file_and_line(book):
    _layered(book, ["shout", ["greet", "count"]])
    done = _static(book)
    assert done.returncode == 1
    assert (
        "python/toy/shout.py:1: `from toy.greet import greet`: shout imports greet, which "
        "is above it in steps.yaml's layers" in done.stdout
    )


def test_a_lazy_import_counts_and_a_type_only_one_does_not(book):
    _layered(book, [["greet", "count"], "shout"])
    greet = book / "python/toy/greet.py"
    original = greet.read_text(encoding="utf-8")
    greet.write_text(
        "from __future__ import annotations\n\nfrom typing import TYPE_CHECKING\n\n"
        "if TYPE_CHECKING:\n    from toy.shout import shout\n\n\n" + original,
        encoding="utf-8",
    )
    assert _static(book).returncode == 0  # under TYPE_CHECKING: never runs
    lazy = "\n\ndef loud(name):\n    from toy.shout import shout\n\n    return shout(name)\n"
    greet.write_text(original + lazy, encoding="utf-8")
    done = _static(book)
    assert done.returncode == 1 and "python/toy/greet.py:6:" in done.stdout
    assert "greet imports shout, which is above it" in done.stdout


def test_parts_of_one_layer_may_not_import_each_other(book):
    _layered(book, [["greet", "shout", "count"]])
    done = _static(book)
    assert done.returncode == 1 and "shout imports greet, which is beside it" in done.stdout


def test_a_part_in_no_layer_is_named(book):
    _layered(book, ["greet", "shout"])  # count is missing
    done = _static(book)
    assert done.returncode == 1
    assert "python/toy/count.py:1: toy.count is in no layer of steps.yaml's `layers`" in done.stdout


def test_a_bad_layers_entry_is_bad_input(book):
    _layered(book, [["greet", "greet"], "shout"])
    done = _static(book)
    assert done.returncode == 2 and "'layers' names greet twice" in done.stderr


def _runtime_graph(package: Path) -> dict[str, set[str]]:
    """Part -> the parts it imports at run time (lazy imports included, TYPE_CHECKING not),
    read independently of the steps tool."""
    graph: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if len(parts) < 2 or parts[1] == "__init__":
            continue
        here = parts[1]
        graph.setdefault(here, set())
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
            for n in ast.walk(node)
        }
        for node in ast.walk(tree):
            if id(node) in skipped or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.ImportFrom) and node.level:
                names = [] if len(parts) > 2 or node.level > 1 else [f"minisgl.{node.module}"]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                names = [alias.name for alias in node.names]
            for name in names:
                if name.startswith("minisgl.") and name.split(".")[1] != here:
                    graph[here].add(name.split(".")[1])
    return graph


def test_the_final_tree_has_no_package_cycle():
    graph = _runtime_graph(REPO / "python/minisgl")
    state: dict[str, str] = {}

    def visit(part: str, path: list[str]) -> None:
        state[part] = "open"
        for target in sorted(graph.get(part, ())):
            assert state.get(target) != "open", f"a cycle: {' -> '.join(path + [target])}"
            if target not in state:
                visit(target, path + [target])
        state[part] = "done"

    for part in sorted(graph):
        if part not in state:
            visit(part, [part])
    layers = [part for layer in load_book(REPO).layers for part in layer]
    assert set(graph) <= set(layers)
    assert not graph["kernel"] & {"engine", "models", "scheduler"}
    assert "models" not in graph["attention"] | graph["kvcache"]
    assert "scheduler" not in graph["speculative"]


def test_an_upward_import_planted_in_the_real_book_is_named(tmp_path):
    """The engine's own layers: kernel/ importing engine/ (the cycle the layers ended) fails
    `check --static` in every chapter whose tree holds the file, at its file and line."""
    root = copy_real_book(tmp_path / "book")
    store = root / "python/minisgl/kernel/store.py"
    lines = store.read_text(encoding="utf-8").splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("import torch"))
    lines.insert(at, "from minisgl.engine.engine import Engine  # noqa: F401\n")
    store.write_text("".join(lines), encoding="utf-8")
    done = steps(root, "check", "--static", "--no-cache", "16-17")
    assert done.returncode == 1
    where = f"python/minisgl/kernel/store.py:{at + 1}: `from minisgl.engine.engine import Engine`"
    assert done.stdout.count(where) == 2  # ch16 and ch17 both hold this version
    assert "kernel imports engine, which is above it" in done.stdout
