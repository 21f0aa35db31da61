"""The import checks: the closure (every import of the package names a module and a name in the
tree) and the layers (a module imports at run time only from its own part of the package and the
layers below it).

Imports are read with `ast`, at the top level and inside functions alike. An import whose line
ends `# forward reference: chNN` is allowed while the tree is older than chapter NN (the
chapter that brings the module); `check` lists it. An import under `if TYPE_CHECKING:` never runs,
so the layers allow it in any direction.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

FORWARD = re.compile(r"#\s*forward reference:\s*ch(\d+)\s*$")


@dataclass(frozen=True)
class Problem:
    where: str  # file:line
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass(frozen=True)
class Forward:
    where: str
    module: str
    chapter: int


@dataclass(frozen=True)
class _Module:
    names: frozenset[str]  # names bound at the module's top level
    open: bool  # a star import or a module __getattr__: any name may exist


class Closure:
    """The modules of one tree: `files` maps a path under package_root to the file holding it."""

    def __init__(self, files: dict[str, Path], shown: dict[Path, str]):
        self.modules = {module_name(p): source for p, source in files.items() if p.endswith(".py")}
        self.packages = {m.split(".")[0] for m in self.modules}
        self.shown = shown  # how to name a file in a message

    def check(self, source: Path, module: str, chapter: int) -> tuple[list[Problem], list[Forward]]:
        """Check one file; `module` is its dotted name ("" for a main outside the package)."""
        problems: list[Problem] = []
        forwards: list[Forward] = []
        lines = source.read_text(encoding="utf-8").splitlines()
        tree = _parse(source, source.stat().st_mtime_ns)
        if isinstance(tree, Problem):
            return [Problem(f"{self.shown[source]}:{tree.where}", tree.message)], []
        is_package = source.name == "__init__.py"
        for node in ast.walk(tree):
            for target, name in _imports(node, module, is_package):
                if target.split(".")[0] not in self.packages:
                    continue
                where = f"{self.shown[source]}:{node.lineno}"
                marked = _forward_mark(lines, node)
                if marked is not None and marked > chapter:
                    forwards.append(Forward(where, target, marked))
                    continue
                message = self._missing(target, name)
                if message:
                    problems.append(Problem(where, message))
        problems.sort(key=lambda p: int(p.where.rsplit(":", 1)[1]))  # ast.walk is breadth-first
        return problems, forwards

    def _missing(self, module: str, name: str | None) -> str:
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix not in self.modules:
                return f"`{_spelled(module, name)}`: no module {prefix} in this tree"
        if name is None or f"{module}.{name}" in self.modules:
            return ""
        found = _names(self.modules[module], self.modules[module].stat().st_mtime_ns)
        if name in found.names or found.open:
            return ""
        return f"`{_spelled(module, name)}`: {module} has no name {name!r} in this tree"


class Layers:
    """steps.yaml's `layers`, bottom first. A part of the package is a subpackage (`engine`) or a
    module at its root (`core`); parts of one layer may not import each other."""

    def __init__(self, order: tuple[tuple[str, ...], ...], shown: dict[Path, str]):
        self.rank = {part: i for i, layer in enumerate(order) for part in layer}
        self.order = order
        self.shown = shown

    def check(self, source: Path, module: str) -> list[Problem]:
        """The runtime imports of one package module that run up (or across) the layers."""
        tree = _parse(source, source.stat().st_mtime_ns)
        if isinstance(tree, Problem):
            return []  # the closure check reports it
        top, _, rest = module.partition(".")
        here = rest.split(".")[0]
        if not here:
            return []  # the package's own __init__
        if here not in self.rank:
            return [
                Problem(
                    f"{self.shown[source]}:1",
                    f"{top}.{here} is in no layer of "
                    "steps.yaml's `layers`: add it where what it imports is below it",
                )
            ]
        problems = []
        for node in _runtime_imports(tree):
            pairs = _imports(node, module, source.name == "__init__.py")
            upward = sorted(
                {_part(top, target) for target, _ in pairs} - {here, None},
                key=lambda part: self.rank.get(part, -1),
            )
            upward = [
                part for part in upward if part in self.rank and self.rank[part] >= self.rank[here]
            ]
            if upward:
                names = [name for target, name in pairs if _part(top, target) == upward[-1]]
                spelled = _spelled(pairs[0][0], ", ".join(n for n in names if n) or None)
                how = "beside" if self.rank[upward[-1]] == self.rank[here] else "above"
                problems.append(
                    Problem(
                        f"{self.shown[source]}:{node.lineno}",
                        f"`{spelled}`: {here} imports {upward[-1]}, which is {how} it in "
                        "steps.yaml's layers; import it under `if TYPE_CHECKING:` if only "
                        "annotations use it, or move what it needs down",
                    )
                )
        return problems


def _part(top: str, target: str) -> str | None:
    """`minisgl.engine.sample` -> `engine` (top `minisgl`); None outside the package or for the
    package itself."""
    package, _, inside = target.partition(".")
    return inside.split(".")[0] or None if package == top else None


def _runtime_imports(tree: ast.Module) -> list[ast.stmt]:
    """Every import statement except those under `if TYPE_CHECKING:`."""
    found: list[ast.stmt] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_name(path: str) -> str:
    """`minisgl/layers/base.py` -> `minisgl.layers.base`; `minisgl/layers/__init__.py` -> the
    package, `minisgl.layers`."""
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _spelled(module: str, name: str | None) -> str:
    return f"from {module} import {name}" if name else f"import {module}"


def _imports(node: ast.AST, module: str, is_package: bool) -> list[tuple[str, str | None]]:
    """(module, name) pairs an import statement needs; name None for a plain `import a.b`."""
    if isinstance(node, ast.Import):
        return [(alias.name, None) for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)] if node.level > 1 else package
        base = ".".join([*package, base] if base else package)
    return [(base, alias.name) for alias in node.names if alias.name != "*"] or [(base, None)]


def _forward_mark(lines: list[str], node: ast.stmt) -> int | None:
    for line in lines[node.lineno - 1 : node.end_lineno or node.lineno]:
        match = FORWARD.search(line)
        if match:
            return int(match.group(1))
    return None


@lru_cache(maxsize=4096)
def _parse(source: Path, mtime: int) -> ast.Module | Problem:
    try:
        return ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
    except SyntaxError as e:
        return Problem(str(e.lineno or 1), f"syntax error: {e.msg}")


@lru_cache(maxsize=4096)
def _names(source: Path, mtime: int) -> _Module:
    tree = _parse(source, mtime)
    if isinstance(tree, Problem):
        return _Module(frozenset(), True)  # reported where the file itself is checked
    names: set[str] = set()
    is_open = False
    for node in _top_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            is_open |= node.name == "__getattr__"
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            is_open |= any(a.name == "*" for a in node.names)
            names |= {a.asname or a.name for a in node.names}
    return _Module(frozenset(names), is_open)


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements that run at import time: the body, and the bodies of if / try / with there."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        for block in ("body", "orelse", "finalbody", "handlers"):
            if isinstance(node, (ast.If, ast.Try, ast.With)) and hasattr(node, block):
                inner = getattr(node, block)
                if block == "handlers":
                    inner = [stmt for handler in inner for stmt in handler.body]
                out += _top_level(inner)
    return out
