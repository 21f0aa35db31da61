"""The closure check: every import of the package names a module and a name in the tree.

Imports are read with `ast`, at the top level and inside functions alike. An import whose line
ends `# forward reference: chNN` is allowed while the tree is older than chapter NN (the
chapter that brings the module); `check` lists it.
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
    for line in lines[node.lineno - 1: node.end_lineno or node.lineno]:
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
