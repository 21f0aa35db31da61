"""Mutation testing of minisgl: plant one small bug at a time and see whether a test notices.

    python tools/mutate.py                                    # every file of every package
    python tools/mutate.py --sample 40                        # 40 mutants of each package
    python tools/mutate.py python/minisgl/scheduler/cache.py  # one file (or one package folder)
    python tools/mutate.py --list python/minisgl/llm          # only print the mutants

Each mutant is one classic edit of one file (a comparison flipped or off by one, ``+``/``-``,
``*``/``//``, an integer constant +1/-1, ``and``/``or``, a ``not`` dropped, ``True``/``False``, a
returned value replaced by ``None``, a call or assignment deleted, a slice bound shifted). It is
written over the file in a private copy of the repository (``--workdir``, a git repository of its
own, never the checkout's files, which other people's test runs read), the tests of the chapters
that add, change or import the file (steps.yaml, read through tools/stepslib) run with ``pytest
-x`` and a timeout, and the file is restored. A mutant is killed when a test fails or times out.
Only the tests that execute the mutated line run, fastest first (per-test coverage of one
unmutated run, the servers and workers the tests start included); a mutant on a line no test
executes survives without a run. ``--sample N`` runs a fixed-seed sample of N mutants of each
package, and the run ends with a table of kill rates by package. Results are kept in the
workdir, so a second run only re-runs the survivors (and only when the tests changed): interrupt
it and start it again at will.
"""

from __future__ import annotations

import argparse
import ast
import bisect
import functools
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tokenize
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "tools") not in sys.path:  # stepslib, the book's model, beside this file
    sys.path.insert(0, str(ROOT / "tools"))

from stepslib.book import Book, load_book  # noqa: E402

PACKAGE = Path("python/minisgl")
COPIED = ("python", "tests", "examples", "pyproject.toml")  # what the tests need of the tree
DEFAULT_WORKDIR = Path("/tmp/minisgl-mutate")

BINARY = {
    ast.Add: "-",
    ast.Sub: "+",
    ast.Mult: "//",
    ast.FloorDiv: "*",
    ast.Div: "*",
    ast.Mod: "//",
}
SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Div: "/", ast.Mod: "%"}
COMPARE = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
}


@dataclass(frozen=True)
class Mutant:
    path: str  # the file, relative to the repository root
    line: int
    kind: str  # what was changed, as "a -> b"
    source: str  # the whole mutated file
    statement: int = 0  # the first line of the statement it is in (for choosing tests)

    @property
    def key(self) -> str:
        return hashlib.sha256(f"{self.path}\0{self.source}".encode()).hexdigest()[:16]

    @property
    def mutated_line(self) -> str:
        return self.source.splitlines()[self.line - 1].strip()


# ---------------------------------------------------------------------------------------------
# Making mutants: edits of the text at the positions ast and tokenize give, so that the rest of
# the file (comments, layout, line numbers) stays as it was.


class _Text:
    """Offsets into a source string from ast's (line, UTF-8 byte column) and tokenize's tokens."""

    def __init__(self, source: str):
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        self.tokens = [
            (self.at(*t.start, chars=True), self.at(*t.end, chars=True), t.string)
            for t in tokens
            if t.type in (tokenize.OP, tokenize.NAME)
        ]
        self.token_starts = [t[0] for t in self.tokens]

    def at(self, line: int, col: int, chars: bool = False) -> int:
        if not chars and line <= len(self.lines):  # ast counts UTF-8 bytes, not characters
            col = len(self.lines[line - 1].encode()[:col].decode(errors="ignore"))
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno, node.end_col_offset)

    def find(self, start: int, end: int, words: str) -> tuple[int, int] | None:
        """The span of the tokens ``words`` (e.g. "is not") between two offsets."""
        want = words.split()
        i = bisect.bisect_left(self.token_starts, start)
        while i < len(self.tokens) and self.tokens[i][0] < end:
            got = [t[2] for t in self.tokens[i : i + len(want)]]
            if got == want:
                return self.tokens[i][0], self.tokens[i + len(want) - 1][1]
            i += 1
        return None

    def replace(self, start: int, end: int, text: str) -> str:
        # Keep every line where it was: a replaced span of several lines leaves blank lines.
        text += "\n" * (self.source.count("\n", start, end) - text.count("\n"))
        return self.source[:start] + text + self.source[end:]


def _skipped_nodes(tree: ast.AST) -> set[int]:
    """ids of nodes that are no behaviour: annotations, docstrings, abstract methods whose body
    is only ``...`` (their defaults are never used: the subclasses' are), and ``assert``
    statements (an invariant the code keeps: one weakened is invisible until the code breaks)."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        is_function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if isinstance(node, ast.Assert) or (is_function and _is_stub(node)):
            roots.append(node)
        elif is_function:
            args = node.args
            every = args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]
            roots += [a.annotation for a in every if a is not None and a.annotation]
            roots += [node.returns] if node.returns else []
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            roots.append(first)
    return {id(n) for root in roots for n in ast.walk(root)}


def _is_stub(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return all(
        isinstance(s, ast.Expr)
        and isinstance(s.value, ast.Constant)
        and (s.value.value is Ellipsis or isinstance(s.value.value, str))
        for s in function.body
    )


def _is_dunder_all(node: ast.Assign) -> bool:
    return any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)


def _is_logging(call: ast.Call) -> bool:
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "logger"
    )


def _edits(node: ast.AST, text: _Text) -> Iterator[tuple[int, int, str, str]]:
    """(start, end, new text, kind) for every mutation of one node."""
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        old, new = SYMBOL[type(node.op)], BINARY[type(node.op)]
        if found := text.find(text.span(node.left)[1], text.span(node.right)[0], old):
            yield *found, new, f"{old} -> {new}"
    elif isinstance(node, ast.AugAssign) and type(node.op) in BINARY:
        old, new = SYMBOL[type(node.op)] + "=", BINARY[type(node.op)] + "="
        if found := text.find(text.span(node.target)[1], text.span(node.value)[0], old):
            yield *found, new, f"{old} -> {new}"
    elif isinstance(node, ast.Compare):
        lefts = [node.left] + node.comparators[:-1]
        for op, left, right in zip(node.ops, lefts, node.comparators):
            old, new = COMPARE[type(op)]
            if found := text.find(text.span(left)[1], text.span(right)[0], old):
                yield *found, new, f"{old} -> {new}"
    elif isinstance(node, ast.BoolOp):
        old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        for left, right in zip(node.values, node.values[1:]):
            if found := text.find(text.span(left)[1], text.span(right)[0], old):
                yield *found, new, f"{old} -> {new}"
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        start, end = text.span(node.operand)
        if found := text.find(text.span(node)[0], start, "not"):
            yield found[0], start if text.source[found[1]] == " " else found[1], "", "not dropped"
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        yield *text.span(node), str(not node.value), f"{node.value} -> {not node.value}"
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        for new in (node.value + 1, node.value - 1):
            yield *text.span(node), f"({new})" if new < 0 else str(new), f"{node.value} -> {new}"
    elif (
        isinstance(node, ast.Return)
        and node.value is not None
        and not (isinstance(node.value, ast.Constant) and node.value.value is None)
    ):
        yield *text.span(node.value), "None", "return value -> None"
    if (
        (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and not _is_logging(node.value)
        )
        or (isinstance(node, ast.Assign) and not _is_dunder_all(node))
        or isinstance(node, ast.AugAssign)
        or (isinstance(node, ast.AnnAssign) and node.value is not None)
    ):
        yield *text.span(node), "pass", "statement deleted"
    if isinstance(node, ast.Slice):  # a bound that is an expression (constants change above)
        for bound, name in ((node.lower, "lower"), (node.upper, "upper")):
            literal = bound.operand if isinstance(bound, ast.UnaryOp) else bound  # -1 too
            if bound is not None and not isinstance(literal, ast.Constant):
                start, end = text.span(bound)
                for sign in "+-":
                    yield (
                        start,
                        end,
                        f"({text.source[start:end]}) {sign} 1",
                        f"slice {name} bound {sign}1",
                    )


def mutants_of(source: str, path: str) -> list[Mutant]:
    """Every mutant of one file that compiles and differs from it, in the order of the text."""
    tree = ast.parse(source)
    text, skipped = _Text(source), _skipped_nodes(tree)
    statement_of = {
        id(n): s.lineno for s in ast.walk(tree) if isinstance(s, ast.stmt) for n in _own_nodes(s)
    }
    seen, result = {source}, []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        for start, end, new, kind in _edits(node, text):
            mutated = text.replace(start, end, new)
            if mutated in seen:
                continue
            seen.add(mutated)
            try:
                compile(mutated, path, "exec")
            except SyntaxError:
                continue
            line = source.count("\n", 0, start) + 1
            result.append(Mutant(path, line, kind, mutated, statement_of.get(id(node), line)))
    return sorted(result, key=lambda m: (m.line, m.kind))


def _own_nodes(statement: ast.stmt) -> Iterator[ast.AST]:
    """The statement and the nodes inside it that no inner statement holds."""
    yield statement
    for child in ast.iter_child_nodes(statement):
        if not isinstance(child, ast.stmt):
            yield from ast.walk(child)


# ---------------------------------------------------------------------------------------------
# The private copy, and a mutant written over one of its files only for as long as the tests run.


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def prepare_workdir(workdir: Path, repo: Path = ROOT) -> None:
    """Copy the tree the tests need into workdir, as a git repository of its own (one commit),
    so that ``git status`` there shows any file left mutated. ``.mutate/`` (results) is kept."""
    workdir.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        target = workdir / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        src = repo / name
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
        shutil.copytree(src, target, ignore=ignore) if src.is_dir() else shutil.copy2(src, target)
    ignored = [
        "__pycache__/",
        ".mutate/",
        ".hypothesis/",
        ".coverage*",
        *(f"python/{name}" for name in HELPERS),
    ]  # the baseline's, if one was cut off
    (workdir / ".gitignore").write_text("".join(f"{line}\n" for line in ignored))
    if not (workdir / ".git").exists():
        _git(workdir, "init", "-q")
    _git(workdir, "add", "-A")
    _git(
        workdir,
        "-c",
        "user.name=mutate",
        "-c",
        "user.email=mutate@localhost",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "snapshot",
    )


def check_imports_the_copy(workdir: Path) -> None:
    """The tests must import the copy's minisgl (the one mutated), not the checkout's."""
    where = subprocess.run(
        [sys.executable, "-c", "import minisgl; print(minisgl.__file__)"],
        cwd=workdir / "tests",
        env=_pytest_env(workdir),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if workdir not in Path(where).parents:
        sys.exit(f"minisgl is imported from {where}, not from the copy in {workdir}")


def unchanged_in_git(workdir: Path) -> bool:
    return _git(workdir, "status", "--porcelain", "--", *COPIED) == ""


def run_mutant(workdir: Path, mutant: Mutant, run: Callable[[], str]) -> str:
    """Write the mutant over its file in workdir, run the tests, and always put the file back."""
    file = workdir / mutant.path
    original = file.read_bytes()
    try:
        file.write_text(mutant.source, encoding="utf-8")
        return run()
    finally:
        file.write_bytes(original)


# ---------------------------------------------------------------------------------------------
# Which chapters test a file: the book says (steps.yaml, through tools/stepslib).


@functools.lru_cache(maxsize=None)
def _book(repo: Path) -> Book:
    return load_book(repo)


def package_of(file: Path) -> str:
    """``engine`` for python/minisgl/engine/sample.py; ``root`` for core.py, env.py, shell.py."""
    return file.parts[2] if len(file.parts) > 3 else "root"


def _module_file(module: str, repo: Path) -> str | None:
    """minisgl.engine.sample -> minisgl/engine/sample.py (book paths), if the file exists."""
    base = repo / PACKAGE.parent / module.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate.relative_to(repo / PACKAGE.parent).as_posix()
    return None


def _imports(tree: ast.AST, package: str = "") -> set[str]:
    """Modules an AST imports, at the top or inside functions: ``from a.b import c`` gives a.b
    and a.b.c (c may be a module). Relative imports resolve against ``package``."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


@functools.lru_cache(maxsize=None)
def imported_files(test: Path, repo: Path) -> frozenset[str]:
    """The package files (book paths, minisgl/...) a test file imports: directly, or through a
    package's ``__init__`` that re-exports them (``from minisgl.scheduler import Scheduler``
    imports scheduler/scheduler.py)."""
    files = {
        f
        for m in _imports(ast.parse(test.read_text(encoding="utf-8")))
        if m.split(".")[0] == PACKAGE.name and (f := _module_file(m, repo))
    }
    for init in [f for f in files if f.endswith("/__init__.py")]:
        package = init.removesuffix("/__init__.py").replace("/", ".")
        tree = ast.parse((repo / PACKAGE.parent / init).read_text(encoding="utf-8"))
        files |= {
            f
            for m in _imports(tree, package)
            if m.startswith(package + ".") and (f := _module_file(m, repo))
        }
    return frozenset(files)


def chapters_of(file: Path, repo: Path = ROOT) -> tuple[str, ...]:
    """The chapters whose tests exercise a file: those that add or change it (steps.yaml's
    ``new`` and ``modified``), and those whose tests import it."""
    book, name = _book(repo), file.relative_to(PACKAGE.parent).as_posix()
    writes = {w.chapter.id for w in book.history.get(name, [])}
    importers = {
        c.id for c in book.chapters if any(name in imported_files(repo / t, repo) for t in c.tests)
    }
    return tuple(sorted(writes | importers))


def tests_of(chapters: Iterable[str], repo: Path = ROOT) -> list[str]:
    """The test files of the chapters (repository paths), as steps.yaml lists them."""
    wanted = set(chapters)
    return sorted({t for c in _book(repo).chapters if c.id in wanted for t in c.tests})


# ---------------------------------------------------------------------------------------------
# Which tests to run for a line: per-test coverage of one run of the tests, every process they
# start included (servers, workers, a shell in a pseudo-terminal).


def _pytest_env(workdir: Path) -> dict[str, str]:
    # PYTHONPATH: import the copy's minisgl; no bytecode: a mutant written in the same second as
    # the file it replaces, with the same size, would otherwise run from the stale .pyc.
    return {
        **os.environ,
        "PYTHONPATH": str(workdir / "python"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONHASHSEED": "0",
    }


def _hash_files(paths: Iterable[Path]) -> str:
    digest = hashlib.sha256()
    for p in paths:
        digest.update(p.as_posix().encode() + b"\0" + p.read_bytes())
    return digest.hexdigest()[:16]


def _tests_hash(workdir: Path) -> str:
    """Of every .py file copied: a survivor runs again when any of them changed."""
    return _hash_files(
        p
        for name in COPIED
        if (workdir / name).is_dir()
        for p in sorted((workdir / name).rglob("*.py"))
    )


def _code_hash(workdir: Path) -> str:
    """Of what every test file's coverage depends on besides itself: the package, the examples
    (tiny_models.py) and the test folder's shared files (conftest.py, helpers.py)."""
    shared = [
        p for p in sorted((workdir / "tests").rglob("*.py")) if not p.name.startswith("test_")
    ]
    return _hash_files(
        [
            *sorted((workdir / "python").rglob("*.py")),
            *sorted((workdir / "examples").rglob("*.py")),
            *shared,
        ]
    )


@dataclass
class Baseline:
    tests_hash: str
    durations: dict[str, float]  # test (file::function) -> seconds, params and phases summed
    setups: dict[str, float]  # test file -> its longest setup (a module's server starting)
    lines: dict[str, dict[str, list[str]]]  # file -> line -> tests that ran it
    imported: dict[str, list[int]]  # file -> lines run while importing (no test's own)
    failing: list[str]  # tests that fail unmutated: never chosen

    def merge(self, other: Baseline) -> None:
        self.durations.update(other.durations)
        for test_file, seconds in other.setups.items():
            self.setups[test_file] = max(seconds, self.setups.get(test_file, 0.0))
        for path, by_line in other.lines.items():
            mine = self.lines.setdefault(path, {})
            for n, tests in by_line.items():
                mine[n] = sorted(set(mine.get(n, [])) | set(tests))
        for path, numbers in other.imported.items():
            self.imported[path] = sorted(set(self.imported.get(path, [])) | set(numbers))
        self.failing = sorted(set(self.failing) | set(other.failing))


# Written into the copy's python/ for the baseline only (the tests' servers and workers put that
# folder on their PYTHONPATH, whatever else they change), and active only where MUTATE_RC is
# set: every Python process the tests start measures itself, under the context of the test
# that is running (the pytest process writes its name to a file; the others follow the file).
SITECUSTOMIZE = """\
import os

if os.environ.get("MUTATE_RC"):
    import threading
    import time

    import coverage

    _cov = coverage.Coverage(config_file=os.environ["MUTATE_RC"], data_suffix=True)
    _cov._warn_no_data = _cov._warn_unimported_source = _cov._warn_preimported_source = False
    _cov._auto_save = True  # saved at exit (and, by the rc's sigterm, on SIGTERM)
    _cov.start()

    def _follow(path: str, ack: str) -> None:
        seen = None
        while True:
            try:
                with open(path) as f:
                    test = f.read()
            except OSError:
                test = seen
            if test != seen:
                seen = test
                try:
                    if test:
                        _cov.switch_context(test)
                    with open(ack + ".tmp", "w") as f:  # pytest waits for this to start a test
                        f.write(test)
                    os.replace(ack + ".tmp", ack)
                except Exception:
                    pass
            time.sleep(0.01)

    if os.environ.get("MUTATE_FOLLOW"):  # a process the tests started, not pytest itself
        _ack = os.path.join(os.environ["MUTATE_FOLLOWERS"], str(os.getpid()))
        threading.Thread(target=_follow, args=(os.environ["MUTATE_CURRENT"], _ack),
                         daemon=True).start()
"""

PLUGIN = """\
import json
import os
import time

import coverage
import pytest

_durations, _setups, _failing = {}, {}, set()


def pytest_configure(config):
    os.environ["MUTATE_FOLLOW"] = "1"  # for the processes the tests start


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # what fixtures do (a server started for the whole module) is told apart: its effect
    # reaches every test that uses the fixture, not only the one that happened to start it
    _switch(item.nodeid.split("[")[0] + "|setup")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    _switch(item.nodeid.split("[")[0])


def _switch(context):
    current = coverage.Coverage.current()
    if current is not None:
        current.switch_context(context)
    path = os.environ["MUTATE_CURRENT"]
    with open(path + ".tmp", "w") as f:
        f.write(context)
    os.replace(path + ".tmp", path)
    # a server that the test asks at once must count its answer as this test's: wait (2 s at
    # most) until every live process of the earlier tests has switched
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        lagging = False
        for entry in os.scandir(os.environ["MUTATE_FOLLOWERS"]):
            if entry.name.endswith(".tmp"):
                continue
            if not _alive(int(entry.name)):
                os.unlink(entry.path)
                continue
            with open(entry.path) as f:
                lagging = lagging or f.read() != context
        if not lagging:
            break
        time.sleep(0.002)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return False
    return text[text.rfind(")") + 2:].split()[0] != "Z"


def pytest_runtest_logreport(report):
    test = report.nodeid.split("[")[0]
    _durations[test] = _durations.get(test, 0.0) + report.duration
    if report.when == "setup":
        module = test.split("::")[0]
        _setups[module] = max(_setups.get(module, 0.0), report.duration)
    if report.failed:
        _failing.add(test)


def pytest_sessionfinish(session):
    with open(os.environ["MUTATE_REPORT"], "w") as f:
        json.dump({"durations": _durations, "setups": _setups, "failing": sorted(_failing)}, f)
"""
HELPERS = ("sitecustomize.py", "_mutate_baseline.py")  # the two files above, in python/


def measure_baseline(workdir: Path, test_files: list[str], timeout: float = 3 * 3600) -> Baseline:
    """Coverage of the test files, unmutated, with a context per test. Kept per test file under
    ``.mutate/baseline/`` and measured again only for files that changed (or whose package,
    examples or shared test files did): a new test costs its own file's run."""
    state = workdir / ".mutate"
    cache = state / "baseline"
    cache.mkdir(parents=True, exist_ok=True)
    # the measuring code is part of the key: a baseline taken by an older version is retaken
    code_hash = (
        _code_hash(workdir) + hashlib.sha256((SITECUSTOMIZE + PLUGIN).encode()).hexdigest()[:8]
    )
    baseline = Baseline(_tests_hash(workdir), {}, {}, {}, {}, [])
    missing = []
    for test_file in test_files:
        key = _hash_files([workdir / test_file]) + code_hash
        cached = cache / (Path(test_file).stem + ".json")
        try:
            stored = json.loads(cached.read_text())
        except (OSError, ValueError):
            stored = {}
        if stored.get("key") == key:
            baseline.merge(Baseline(**stored["baseline"]))
        else:
            missing.append(test_file)
    if missing:
        measured = _measure(workdir, missing, timeout)
        for test_file in missing:
            key = _hash_files([workdir / test_file]) + code_hash
            part = _part_of(measured, test_file)
            (cache / (Path(test_file).stem + ".json")).write_text(
                json.dumps({"key": key, "baseline": asdict(part)})
            )
            baseline.merge(part)
    if baseline.failing:
        print(
            f"baseline: {len(baseline.failing)} tests fail unmutated and are never chosen: "
            + ", ".join(baseline.failing),
            flush=True,
        )
    return baseline


def _part_of(measured: Baseline, test_file: str) -> Baseline:
    """The share of one test file in a baseline measured over several."""
    mine = lambda test: test.split("::")[0] == test_file  # noqa: E731
    lines = {
        path: {n: [t for t in tests if mine(t)] for n, tests in by_line.items()}
        for path, by_line in measured.lines.items()
    }
    return Baseline(
        measured.tests_hash,
        {t: s for t, s in measured.durations.items() if mine(t)},
        {f: s for f, s in measured.setups.items() if f == test_file},
        {path: {n: ts for n, ts in by_line.items() if ts} for path, by_line in lines.items()},
        measured.imported,
        [t for t in measured.failing if mine(t)],
    )


def _measure(workdir: Path, test_files: list[str], timeout: float) -> Baseline:
    state = workdir / ".mutate"
    data = state / "coverage"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir()
    rc = state / "coveragerc"
    rc.write_text(
        f"[run]\nsource = {workdir / PACKAGE}\ndata_file = {data / 'coverage'}\n"
        "parallel = true\nsigterm = true\n"
    )
    report_file, current = state / "baseline-report.json", state / "current-test"
    report_file.unlink(missing_ok=True)
    current.write_text("")
    followers = state / "followers"
    shutil.rmtree(followers, ignore_errors=True)
    followers.mkdir()
    env = {
        **_pytest_env(workdir),
        "MUTATE_RC": str(rc),
        "MUTATE_CURRENT": str(current),
        "MUTATE_REPORT": str(report_file),
        "MUTATE_FOLLOWERS": str(followers),
    }
    env.pop("MUTATE_FOLLOW", None)
    for name, text in zip(HELPERS, (SITECUSTOMIZE, PLUGIN)):
        (workdir / "python" / name).write_text(text)
    print(f"baseline: {len(test_files)} test files under coverage ...", flush=True)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "_mutate_baseline",
        "-p",
        "no:randomly",
        *test_files,
    ]
    started = time.monotonic()
    try:
        done = _run_group(cmd, workdir, env, timeout, state / "baseline.log")
    finally:
        for name in HELPERS:
            (workdir / "python" / name).unlink(missing_ok=True)
    print(f"baseline: {time.monotonic() - started:.0f} s", flush=True)
    if not report_file.exists():
        sys.exit(
            f"the baseline run of the tests in {workdir} did not finish "
            f"(exit {done.returncode}):\n{done.stdout[-3000:]}"
        )
    report = json.loads(report_file.read_text())
    lines, imported = _coverage_lines(workdir, rc, data)
    if not lines:
        sys.exit("coverage saw no line of the copy's minisgl: the tests imported another one")
    return Baseline(
        _tests_hash(workdir),
        report["durations"],
        report["setups"],
        lines,
        imported,
        report["failing"],
    )


def _run_group(
    cmd: list[str], cwd: Path, env: dict[str, str], timeout: float, log: Path | None = None
) -> subprocess.CompletedProcess:
    """Run a command in a process group of its own; whatever it leaves running, or all of it on
    a timeout, is killed by that group (and, for what left the group, as our descendant). Its
    output goes to a file: a server left behind would hold a pipe open."""
    log = log or Path(cwd) / ".mutate-run.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            _kill_group(proc.pid)
            proc.wait()
    text = log.read_text(errors="replace")
    return subprocess.CompletedProcess(cmd, proc.returncode, text, "")


def _coverage_lines(workdir: Path, rc: Path, data: Path) -> tuple[dict, dict]:
    from coverage import Coverage, CoverageData

    combiner = Coverage(config_file=str(rc))
    combiner.combine([str(data)], strict=True)
    combiner.save()
    covered = CoverageData(basename=str(data / "coverage"))
    covered.read()
    lines: dict[str, dict[str, list[str]]] = {}
    imported: dict[str, list[int]] = {}
    for measured in covered.measured_files():
        path = str(Path(measured).relative_to(workdir))
        by_line = covered.contexts_by_lineno(measured)
        lines[path] = {str(n): sorted(c for c in ctx if c) for n, ctx in by_line.items()}
        imported[path] = sorted(n for n, ctx in by_line.items() if "" in ctx)
    return lines, imported


@functools.lru_cache(maxsize=256)
def _scopes(source: str) -> list[tuple[int, int, int]]:
    """(first line, last line, first line of the body) of every def and class, innermost last."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append((node.lineno, node.end_lineno or node.lineno, node.body[0].lineno))
    return sorted(found, key=lambda s: (s[0], -s[1]))


def _scope_lines(mutant: Mutant, original: str) -> range | None:
    """The lines whose tests may see a mutant on a line run only at import: a def's signature
    (a default) -> the def's; a class body's statement -> the class's; else the whole file."""
    inner = None
    for first, last, _body in _scopes(original):
        if first <= mutant.line <= last:
            inner = (first, last)
    return range(inner[0], inner[1] + 1) if inner else None


def tests_for(
    mutant: Mutant, baseline: Baseline, package_tests: list[str], original: str = ""
) -> list[str] | None:
    """The package's tests that run the mutant's line or its statement's first line (the rest
    of a statement of several lines may be skipped: ``a and b`` on two lines), fastest first.
    None: no test runs it. A line run while importing (a def's defaults, a class attribute, a
    module constant) may matter to any test that runs its def, class or file: those run."""
    files, failing = set(package_tests), set(baseline.failing)
    by_line = baseline.lines.get(mutant.path, {})
    lines = {mutant.line, mutant.statement}
    contexts = {c for n in lines for c in by_line.get(str(n), [])}
    if lines & set(baseline.imported.get(mutant.path, [])):
        scope = _scope_lines(mutant, original) if original else None
        inside = (
            by_line.items()
            if scope is None
            else ((n, ts) for n, ts in by_line.items() if int(n) in scope)
        )
        contexts |= {c for _n, cs in inside for c in cs}
    covering = {t for c in contexts for t in _tests_of_context(c, baseline)}
    chosen = [t for t in covering if t.split("::")[0] in files and t not in failing]
    if not chosen:
        return None
    return sorted(chosen, key=lambda t: (baseline.durations.get(t, 0.0), t))


def _tests_of_context(context: str, baseline: Baseline) -> set[str]:
    """A test's own context is that test; a test's setup (fixtures: a module's server, say)
    stands for every test of its module, since any of them may use what the fixture made."""
    test, _, phase = context.partition("|")
    if phase != "setup":
        return {test}
    module = test.split("::")[0]
    return {t for t in baseline.durations if t.split("::")[0] == module}


def timeout_for(tests: list[str], baseline: Baseline) -> float:
    """Three times the tests' time, each module's longest setup (a server started by a fixture
    that another test set up in the baseline) and 30 s: past that, a mutant hangs."""
    seconds = sum(baseline.durations.get(t, 1.0) for t in tests)
    seconds += sum(baseline.setups.get(f, 0.0) for f in {t.split("::")[0] for t in tests})
    return 3 * seconds + 30


# ---------------------------------------------------------------------------------------------
# Processes: a mutant's tests start servers and workers; none may outlive the mutant.


def _set_subreaper() -> None:
    """Orphans of the tests (a server whose parent died, a shell in a session of its own) are
    handed to this process rather than to init, so that _kill_descendants finds them."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _descendants(root: int) -> list[int]:
    """Every live process below ``root``, from /proc's parent links (Linux)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    """Running, or stopped: not gone and not a zombie (a zombie's parent reaps it)."""
    try:
        text = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return text[text.rfind(")") + 2 :].split()[0] != "Z"


def _kill_group(pid: int) -> None:
    """Kill the process group ``pid`` leads and every other descendant of this process (a
    child that called setsid, like pexpect's, left the group), each by its id, and wait until
    they are gone, reaping those handed to us. ``pid`` itself is left to its caller to reap."""
    others = [p for p in _descendants(os.getpid()) if p != pid]
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for child in others:
        try:
            os.kill(child, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + 10
    while others and time.monotonic() < deadline:
        for child in others:
            try:
                os.waitpid(child, os.WNOHANG)
            except ChildProcessError:  # not ours (still under its parent), or reaped already
                pass
        others = [p for p in others if _alive(p)]
        time.sleep(0.02) if others else None


class ForkRunner:
    """Runs pytest in a fork of this process, which has already imported torch, transformers
    and pytest and made the tiny models once: a mutant then costs its tests, not 5-10 s of
    start-up. This process never imports minisgl, so each fork imports the file as mutated.
    The fork leads a process group of its own, killed when it ends or times out."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        os.environ.update(_pytest_env(workdir))
        sys.dont_write_bytecode = True
        import hypothesis  # noqa: F401
        import pytest  # noqa: F401
        import torch
        import transformers  # noqa: F401

        torch.set_num_threads(1)  # no OpenMP pool in the parent: a fork must not inherit one
        sys.path[:0] = [str(workdir / "examples"), str(workdir / "tests")]
        import tiny_models

        made, make = workdir / ".mutate" / "models", tiny_models.make_tiny_model

        def make_once(name: str, directory: Path) -> Path:  # every session gets the same ones
            if not (made / name / "config.json").exists():
                shutil.rmtree(made / name, ignore_errors=True)
                make(name, made / name)
            return made / name

        tiny_models.make_tiny_model = make_once
        if "minisgl" in sys.modules:
            raise RuntimeError("minisgl imported before the fork: mutants would not be seen")

    def __call__(self, tests: list[str], timeout: float) -> Callable[[], str]:
        return lambda: self.run(tests, timeout)

    def run(self, tests: list[str], timeout: float) -> str:
        pid = os.fork()
        if pid == 0:  # the child: run the tests, never return into the caller's code
            code = 3
            try:
                os.setpgid(0, 0)
                quiet = os.open(os.devnull, os.O_WRONLY)
                os.dup2(quiet, 1), os.dup2(quiet, 2)
                os.chdir(self.workdir)
                import pytest

                code = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", *tests]))
            finally:
                os._exit(code)
        try:
            os.setpgid(pid, pid)  # also here: no race with a kill before the child set it
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    return "survived" if os.waitstatus_to_exitcode(status) == 0 else "killed"
                time.sleep(0.05)
            return "timeout"
        finally:
            _kill_group(pid)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


# ---------------------------------------------------------------------------------------------
# The run: files, a sample of each package's mutants, results kept between runs, the table.


def target_files(targets: list[str], repo: Path = ROOT) -> list[Path]:
    """The .py files (relative to the repository) of the packages or files named; by default
    every one of python/minisgl, root modules (core.py, env.py, shell.py, ...) included."""
    names = targets or [str(PACKAGE)]
    files: list[Path] = []
    for name in names:
        path = (repo / name).resolve()  # a path from the repository's root, or from here
        if not path.exists() and Path(name).exists():
            path = Path(name).resolve()
        found = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        files += [p.relative_to(repo.resolve()) for p in found if "__pycache__" not in p.parts]
    for f in files:
        if f.parts[:2] != PACKAGE.parts or len(f.parts) < 3 or f.suffix != ".py":
            sys.exit(f"{f}: not a .py file of {PACKAGE}")
    return sorted(set(files), key=lambda f: (package_of(f), f))


def sample(mutants: list[Mutant], n: int | None, seed: int = 0) -> list[Mutant]:
    """A fixed-seed sample of ``n`` mutants (all when n is None), in their order. Each mutant's
    rank is a hash of the seed and what it is (file, line, kind, the mutated line, which of its
    equals it is), not of the whole file: an edit elsewhere in a package changes the choice
    only by the mutants it adds or removes."""
    if n is None or n >= len(mutants):
        return list(mutants)
    seen: dict[tuple, int] = {}
    ranked = []
    for m in mutants:
        what = (m.path, m.line, m.kind, m.mutated_line)
        seen[what] = seen.get(what, -1) + 1
        rank = hashlib.sha256(repr((seed, *what, seen[what])).encode()).hexdigest()
        ranked.append((rank, m))
    chosen = {id(m) for _r, m in sorted(ranked, key=lambda r: r[0])[:n]}
    return [m for m in mutants if id(m) in chosen]


def _load_results(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    return {r["key"]: r for r in map(json.loads, path.read_text().splitlines())}


def mutate(
    workdir: Path,
    mutants: list[Mutant],
    baseline: Baseline,
    results: dict[str, dict],
    log: Path,
    runner: ForkRunner,
) -> list[dict]:
    rows = []
    for mutant in mutants:
        old = results.get(mutant.key)
        if old and (
            old["status"] in ("killed", "timeout") or old["tests_hash"] == baseline.tests_hash
        ):
            rows.append(old)
            continue
        file = Path(mutant.path)
        original = (workdir / file).read_text(encoding="utf-8")
        tests = tests_for(mutant, baseline, tests_of(chapters_of(file)), original)
        started = time.monotonic()
        if tests is None:
            status = "not covered"
        else:
            status = run_mutant(workdir, mutant, runner(tests, timeout_for(tests, baseline)))
        row = dict(
            key=mutant.key,
            path=mutant.path,
            line=mutant.line,
            kind=mutant.kind,
            mutated=mutant.mutated_line,
            status=status,
            tests_hash=baseline.tests_hash,
            seconds=round(time.monotonic() - started, 1),
        )
        print(
            f"  {status:11s} {mutant.path}:{mutant.line} {mutant.kind}: {row['mutated']}",
            flush=True,
        )
        with log.open("a") as out:
            out.write(json.dumps(row) + "\n")
        results[mutant.key] = row
        rows.append(row)
    return rows


def counts(rows: list[dict]) -> dict[str, int]:
    count = {
        s: sum(r["status"] == s for r in rows)
        for s in ("killed", "timeout", "survived", "not covered")
    }
    return {"mutants": len(rows), **count}


def _rate(count: dict[str, int]) -> str:
    dead = count["killed"] + count["timeout"]
    return f"{100 * dead / count['mutants']:.1f}%" if count["mutants"] else "-"


def summary_table(rows_by_package: dict[str, list[dict]], totals: dict[str, int]) -> str:
    """The per-package table (Markdown): mutants run of all made, killed (timeouts among them),
    survived, not covered (no test runs the line), kill rate."""
    out = [
        "| package | mutants | of | killed | (timeouts) | survived | not covered | kill rate |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    every: list[dict] = []
    for package, rows in rows_by_package.items():
        every += rows
        c = counts(rows)
        out.append(
            f"| `{package}` | {c['mutants']} | {totals[package]} | "
            f"{c['killed'] + c['timeout']} | {c['timeout']} | {c['survived']} | "
            f"{c['not covered']} | {_rate(c)} |"
        )
    c = counts(every)
    out.append(
        f"| all | {c['mutants']} | {sum(totals.values())} | "
        f"{c['killed'] + c['timeout']} | {c['timeout']} | {c['survived']} | "
        f"{c['not covered']} | {_rate(c)} |"
    )
    return "\n".join(out)


def report(rows_by_file: dict[Path, list[dict]], totals: dict[str, int]) -> None:
    print(
        f"\n{'file':44s} {'mutants':>7s} {'killed':>6s} {'t/out':>5s} {'surv':>4s} "
        f"{'uncov':>5s} {'killed%':>7s} {'sec':>6s}"
    )
    packages: dict[str, list[dict]] = {}
    for file, rows in rows_by_file.items():
        packages.setdefault(package_of(file), []).extend(rows)
        if rows:
            _report_line(str(file.relative_to(PACKAGE)), rows)
    survivors = [
        r
        for rows in rows_by_file.values()
        for r in rows
        if r["status"] in ("survived", "not covered")
    ]
    if survivors:
        print("\nsurvivors:")
    for r in survivors:
        note = " (no test runs this line)" if r["status"] == "not covered" else ""
        print(f"  {r['path']}:{r['line']}  {r['kind']}{note}\n      {r['mutated']}")
    print("\n" + summary_table(packages, totals))


def _report_line(name: str, rows: list[dict]) -> None:
    c = counts(rows)
    seconds = sum(r["seconds"] for r in rows)
    print(
        f"{name:44s} {c['mutants']:7d} {c['killed']:6d} {c['timeout']:5d} "
        f"{c['survived']:4d} {c['not covered']:5d} {_rate(c):>7s} {seconds:6.0f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "targets", nargs="*", help="files or package folders under python/minisgl (default: all)"
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=DEFAULT_WORKDIR,
        help=f"the private copy the mutants are written in ({DEFAULT_WORKDIR})",
    )
    parser.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help="run a fixed-seed sample of N mutants of each package",
    )
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (0)")
    parser.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    parser.add_argument(
        "--report",
        action="store_true",
        help="the table of the results kept in the workdir for these mutants, run nothing",
    )
    parser.add_argument("--fresh", action="store_true", help="forget the results of earlier runs")
    args = parser.parse_args(argv)
    files = target_files(args.targets)
    by_package: dict[str, list[Mutant]] = {}
    for file in files:
        source = (ROOT / file).read_text(encoding="utf-8")
        by_package.setdefault(package_of(file), []).extend(mutants_of(source, str(file)))
    totals = {p: len(ms) for p, ms in by_package.items()}
    chosen = {p: sample(ms, args.sample, args.seed) for p, ms in by_package.items()}
    if args.list:
        for package, mutants in chosen.items():
            for m in mutants:
                print(f"{m.path}:{m.line}  {m.kind}: {m.mutated_line}")
        return 0
    workdir = args.workdir.resolve()
    if args.report:  # what an interrupted run, or several, found: mutants not run are left out
        results = _load_results(workdir / ".mutate" / "results.jsonl")
        found = {p: [results[m.key] for m in ms if m.key in results] for p, ms in chosen.items()}
        for package, mutants in chosen.items():
            if len(found[package]) < len(mutants):
                print(f"{package}: {len(mutants) - len(found[package])} mutants not run yet")
        print(summary_table(found, totals))
        return 0
    if workdir == ROOT or ROOT in workdir.parents:
        sys.exit("--workdir must be outside the repository: mutants are written there")
    prepare_workdir(workdir)
    check_imports_the_copy(workdir)
    _set_subreaper()  # before the baseline: its tests start servers too
    log = workdir / ".mutate" / "results.jsonl"
    if args.fresh:
        log.unlink(missing_ok=True)
    started = time.monotonic()
    wanted = {Path(m.path) for ms in chosen.values() for m in ms}
    test_files = sorted({t for f in wanted for t in tests_of(chapters_of(f))})
    baseline = measure_baseline(workdir, test_files)
    results = _load_results(log)
    runner, rows = ForkRunner(workdir), {}
    try:
        for package, mutants in chosen.items():
            print(f"{package}/: {len(mutants)} of {totals[package]} mutants", flush=True)
            done = mutate(workdir, mutants, baseline, results, log, runner)
            for file in files:
                if package_of(file) == package:
                    rows[file] = [r for r in done if r["path"] == str(file)]
    finally:
        clean = unchanged_in_git(workdir)
        print(
            f"\nworkdir {workdir}: "
            + (
                "every file restored (git status clean)"
                if clean
                else "FILES LEFT CHANGED: see git status there"
            )
        )
    report(rows, totals)
    print(f"\n{time.monotonic() - started:.0f} s, {time.strftime('%Y-%m-%d')}")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
