"""Mutation testing of minisgl: plant one small bug at a time and see whether a test notices.

    python tools/mutate.py                                    # the five packages below
    python tools/mutate.py python/minisgl/kernel/fused_moe.py # a later package's file
    python tools/mutate.py python/minisgl/scheduler/cache.py  # one file (or one package folder)
    python tools/mutate.py --list python/minisgl/llm          # only print the mutants

Each mutant is one classic edit of one file (a comparison flipped or off by one, ``+``/``-``,
``*``/``//``, an integer constant +1/-1, ``and``/``or``, a ``not`` dropped, ``True``/``False``, a
returned value replaced by ``None``, a call or assignment deleted, a slice bound shifted). It is
written over the file in a private copy of the repository (``--workdir``, a git repository of its
own, never the checkout's files, which other people's test runs read), the chapter tests that
exercise the package run with ``pytest -x`` and a timeout, and the file is restored. A mutant is
killed when a test fails or times out. Only the tests that execute the mutated line run, fastest
first (per-test coverage of one unmutated run); a mutant on a line no test executes survives
without a run. Results are kept in the workdir, so a second run only re-runs the survivors (and
only when the tests changed): interrupt it and start it again at will.
"""

from __future__ import annotations

import argparse
import ast
import bisect
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
PACKAGE = Path("python/minisgl")
# Which chapters' tests exercise each package (kvcache, say, is built in ch05 and used by ch07-08).
PACKAGE_CHAPTERS = {
    "kvcache": ("ch05", "ch07", "ch08"),
    "scheduler": ("ch07", "ch08", "ch09", "ch10"),
    "engine": ("ch04", "ch06", "ch07"),
    "attention": ("ch05", "ch06"),
    "llm": ("ch10",),
    # later packages, named on the command line only: the chapters that add or change each file
    # (steps.yaml) choose its tests; their kernels run in Triton's interpreter
    "kernel": (),
    "moe": (),
}
LAST_CHAPTER = max(c for cs in PACKAGE_CHAPTERS.values() for c in cs)  # by default, files to here
COPIED = ("python", "tests", "examples", "pyproject.toml")  # what the tests need of the tree
DEFAULT_WORKDIR = Path("/tmp/minisgl-mutate")

BINARY = {ast.Add: "-", ast.Sub: "+", ast.Mult: "//", ast.FloorDiv: "*", ast.Div: "*",
          ast.Mod: "//"}
SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Div: "/",
          ast.Mod: "%"}
COMPARE = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="),
           ast.GtE: (">=", ">"), ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="),
           ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is"), ast.In: ("in", "not in"),
           ast.NotIn: ("not in", "in")}


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
        self.tokens = [(self.at(*t.start, chars=True), self.at(*t.end, chars=True), t.string)
                       for t in tokens if t.type in (tokenize.OP, tokenize.NAME)]
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
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and isinstance(first.value.value, str):
            roots.append(first)
    return {id(n) for root in roots for n in ast.walk(root)}


def _is_stub(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
               and (s.value.value is Ellipsis or isinstance(s.value.value, str))
               for s in function.body)


def _is_dunder_all(node: ast.Assign) -> bool:
    return any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)


def _is_logging(call: ast.Call) -> bool:
    func = call.func
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
        and func.value.id == "logger"


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
    elif isinstance(node, ast.Return) and node.value is not None \
            and not (isinstance(node.value, ast.Constant) and node.value.value is None):
        yield *text.span(node.value), "None", "return value -> None"
    if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
          and not _is_logging(node.value)) \
            or (isinstance(node, ast.Assign) and not _is_dunder_all(node)) \
            or isinstance(node, ast.AugAssign) \
            or (isinstance(node, ast.AnnAssign) and node.value is not None):
        yield *text.span(node), "pass", "statement deleted"
    if isinstance(node, ast.Slice):  # a bound that is an expression (constants change above)
        for bound, name in ((node.lower, "lower"), (node.upper, "upper")):
            literal = bound.operand if isinstance(bound, ast.UnaryOp) else bound  # -1 too
            if bound is not None and not isinstance(literal, ast.Constant):
                start, end = text.span(bound)
                for sign in "+-":
                    yield start, end, f"({text.source[start:end]}) {sign} 1", \
                        f"slice {name} bound {sign}1"


def mutants_of(source: str, path: str) -> list[Mutant]:
    """Every mutant of one file that compiles and differs from it, in the order of the text."""
    tree = ast.parse(source)
    text, skipped = _Text(source), _skipped_nodes(tree)
    statement_of = {id(n): s.lineno for s in ast.walk(tree) if isinstance(s, ast.stmt)
                    for n in _own_nodes(s)}
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
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


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
    (workdir / ".gitignore").write_text("__pycache__/\n.mutate/\n.hypothesis/\n.coverage*\n")
    if not (workdir / ".git").exists():
        _git(workdir, "init", "-q")
    _git(workdir, "add", "-A")
    _git(workdir, "-c", "user.name=mutate", "-c", "user.email=mutate@localhost", "commit", "-q",
         "--allow-empty", "-m", "snapshot")


def check_imports_the_copy(workdir: Path) -> None:
    """The tests must import the copy's minisgl (the one mutated), not the checkout's."""
    where = subprocess.run([sys.executable, "-c", "import minisgl; print(minisgl.__file__)"],
                           cwd=workdir / "tests", env=_pytest_env(workdir), check=True,
                           capture_output=True, text=True).stdout.strip()
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
# Which tests to run for a line: per-test coverage of one run of every chapter's tests.


def _book_chapters(repo: Path = ROOT) -> list[dict]:
    import yaml

    book = yaml.safe_load((repo / "steps.yaml").read_text())
    return [chapter for stage in book["stages"] for chapter in stage["chapters"]]


def _in_steps(file: Path, chapter: dict, lists: tuple[str, ...] = ("new", "modified")) -> bool:
    name = file.relative_to(PACKAGE.parent).as_posix()  # steps.yaml's paths: minisgl/...
    return any(name in (chapter.get(key) or []) for key in lists)


def chapters_of(file: Path, repo: Path = ROOT) -> tuple[str, ...]:
    """The chapters whose tests exercise a file: its package's, and those that add or change it
    (steps.yaml), so that a file a later chapter adds is tested by that chapter too."""
    own = {c["id"] for c in _book_chapters(repo) if _in_steps(file, c)}
    return tuple(sorted(set(PACKAGE_CHAPTERS[file.parts[2]]) | own))


def _chapter_tests(workdir: Path, chapters: Iterable[str]) -> list[str]:
    return sorted(str(p.relative_to(workdir)) for c in chapters
                  for p in (workdir / "tests").glob(f"test_{c}_*.py"))


def _tests_hash(workdir: Path) -> str:
    digest = hashlib.sha256()
    for name in COPIED:
        for p in sorted((workdir / name).rglob("*.py")) if (workdir / name).is_dir() else []:
            digest.update(p.read_bytes())
    return digest.hexdigest()[:16]


def _pytest_env(workdir: Path) -> dict[str, str]:
    # PYTHONPATH: import the copy's minisgl; no bytecode: a mutant written in the same second as
    # the file it replaces, with the same size, would otherwise run from the stale .pyc.
    return {**os.environ, "PYTHONPATH": str(workdir / "python"), "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


@dataclass
class Baseline:
    tests_hash: str
    chapters: list[str]  # whose tests ran
    durations: dict[str, float]  # test function (file::name) -> seconds, params summed
    lines: dict[str, dict[str, list[str]]]  # file -> line -> test functions that ran it
    imported: dict[str, list[int]]  # file -> lines run while importing (no test's own)


def measure_baseline(workdir: Path, chapters: list[str]) -> Baseline:
    """Run the chapters' tests once, unmutated, under coverage with a context per test."""
    state = workdir / ".mutate"
    state.mkdir(exist_ok=True)
    cached, tests_hash = state / "baseline.json", _tests_hash(workdir)
    if cached.exists():
        try:
            baseline = Baseline(**json.loads(cached.read_text()))
        except TypeError:  # written by an older version of this tool
            baseline = None
        if baseline and baseline.tests_hash == tests_hash \
                and set(chapters) <= set(baseline.chapters):
            return baseline
    rc = state / "coveragerc"
    rc.write_text(f"[run]\ndynamic_context = test_function\nsource = {workdir / PACKAGE}\n"
                  f"data_file = {state / 'coverage'}\n")
    junit = state / "junit.xml"
    print(f"baseline: the tests of {', '.join(chapters)} under coverage ...", flush=True)
    cmd = [sys.executable, "-m", "coverage", "run", f"--rcfile={rc}", "-m", "pytest", "-q",
           "-p", "no:randomly", f"--junitxml={junit}", *_chapter_tests(workdir, chapters)]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=workdir, env=_pytest_env(workdir), capture_output=True,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"the unmutated tests fail in {workdir}:\n{done.stdout[-3000:]}")
    print(f"baseline: {time.monotonic() - started:.0f} s", flush=True)
    lines, imported = _coverage_lines(workdir, state)
    if not lines:
        sys.exit("coverage saw no line of the copy's minisgl: the tests imported another one")
    baseline = Baseline(tests_hash, chapters, _durations(junit), lines, imported)
    cached.write_text(json.dumps(asdict(baseline)))
    return baseline


def _durations(junit: Path) -> dict[str, float]:
    import xml.etree.ElementTree as ET

    durations: dict[str, float] = {}
    for case in ET.parse(junit).iter("testcase"):
        module = case.get("classname", "").split(".")[-1]
        name = f"tests/{module}.py::{case.get('name', '').split('[')[0]}"
        durations[name] = durations.get(name, 0.0) + float(case.get("time", 0))
    return durations


def _coverage_lines(workdir: Path, state: Path) -> tuple[dict, dict]:
    from coverage import CoverageData

    data = CoverageData(basename=str(state / "coverage"))
    data.read()
    lines: dict[str, dict[str, list[str]]] = {}
    imported: dict[str, list[int]] = {}
    for measured in data.measured_files():
        path = str(Path(measured).relative_to(workdir))
        by_line = data.contexts_by_lineno(measured)
        lines[path] = {str(n): sorted(_test_id(c) for c in ctx if c) for n, ctx in by_line.items()}
        imported[path] = sorted(n for n, ctx in by_line.items() if "" in ctx)
    return lines, imported


def _test_id(context: str) -> str:
    module, _, function = context.rpartition(".")  # e.g. "test_ch07_scheduler.test_x"
    return f"tests/{module.split('.')[-1]}.py::{function}"


def tests_for(mutant: Mutant, baseline: Baseline, package_tests: list[str]) -> list[str] | None:
    """The package's tests that run the mutant's line or its statement's first line (the rest
    of a statement of several lines may be skipped: ``a and b`` on two lines), fastest first.
    None: no test runs it. A line run while importing (a def, a class attribute) may matter
    to any test: all run."""
    files = set(package_tests)
    by_line = baseline.lines.get(mutant.path, {})
    lines = {mutant.line, mutant.statement}
    covering = {t for n in lines for t in by_line.get(str(n), [])}
    if lines & set(baseline.imported.get(mutant.path, [])):
        covering |= {t for t in baseline.durations}
    chosen = [t for t in covering if t.split("::")[0] in files]
    if not chosen:
        return None
    return sorted(chosen, key=lambda t: (baseline.durations.get(t, 0.0), t))


class ForkRunner:
    """Runs pytest in a fork of this process, which has already imported torch, transformers
    and pytest and made the tiny models once: a mutant then costs its tests, not 5-10 s of
    start-up. This process never imports minisgl, so each fork imports the file as mutated."""

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
                quiet = os.open(os.devnull, os.O_WRONLY)
                os.dup2(quiet, 1), os.dup2(quiet, 2)
                os.chdir(self.workdir)
                import pytest

                code = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", *tests]))
            finally:
                os._exit(code)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return "survived" if os.waitstatus_to_exitcode(status) == 0 else "killed"
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return "timeout"


# ---------------------------------------------------------------------------------------------
# The run: files, results kept between runs, the table.


def target_files(targets: list[str], repo: Path = ROOT) -> list[Path]:
    """The .py files (relative to the repository) of the packages or files named; by default
    those of the five packages that chapters up to LAST_CHAPTER add."""
    names = targets or [str(PACKAGE / p) for p in PACKAGE_CHAPTERS if (repo / PACKAGE / p).is_dir()]
    files: list[Path] = []
    for name in names:
        path = (repo / name).resolve()
        found = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        files += [p.relative_to(repo) for p in found if "__pycache__" not in p.parts]
    for f in files:
        if f.parts[:2] != PACKAGE.parts or len(f.parts) < 4 or f.parts[2] not in PACKAGE_CHAPTERS:
            sys.exit(f"{f}: not a file of the packages {', '.join(PACKAGE_CHAPTERS)}")
    if not targets:
        early = {c["id"]: c for c in _book_chapters(repo) if c["id"] <= LAST_CHAPTER}
        files = [f for f in files if any(_in_steps(f, c, ("new",)) for c in early.values())]
    return files


def _load_results(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    return {r["key"]: r for r in map(json.loads, path.read_text().splitlines())}


def mutate_file(workdir: Path, file: Path, baseline: Baseline, results: dict[str, dict],
                log: Path, runner: ForkRunner) -> list[dict]:
    package_tests = _chapter_tests(workdir, chapters_of(file))
    source = (workdir / file).read_text(encoding="utf-8")
    rows = []
    for mutant in mutants_of(source, str(file)):
        old = results.get(mutant.key)
        if old and (old["status"] in ("killed", "timeout") or
                    old["tests_hash"] == baseline.tests_hash):
            rows.append(old)
            continue
        tests = tests_for(mutant, baseline, package_tests)
        started = time.monotonic()
        if tests is None:
            status = "not covered"
        else:
            budget = sum(baseline.durations.get(t, 1.0) for t in tests)
            status = run_mutant(workdir, mutant, runner(tests, timeout=3 * budget + 30))
        row = dict(key=mutant.key, path=mutant.path, line=mutant.line, kind=mutant.kind,
                   mutated=mutant.mutated_line, status=status, tests_hash=baseline.tests_hash,
                   seconds=round(time.monotonic() - started, 1))
        print(f"  {status:11s} {mutant.path}:{mutant.line} {mutant.kind}: {row['mutated']}",
              flush=True)
        with log.open("a") as out:
            out.write(json.dumps(row) + "\n")
        results[mutant.key] = row
        rows.append(row)
    return rows


def report(rows_by_file: dict[Path, list[dict]]) -> None:
    print(f"\n{'file':44s} {'mutants':>7s} {'killed':>6s} {'t/out':>5s} {'surv':>4s} "
          f"{'uncov':>5s} {'killed%':>7s} {'sec':>6s}")
    packages: dict[str, list[dict]] = {}
    for file, rows in rows_by_file.items():
        packages.setdefault(file.parts[2], []).extend(rows)
        _report_line(str(file.relative_to(PACKAGE)), rows)
    print()
    for package, rows in packages.items():
        _report_line(f"{package}/ (all)", rows)
    survivors = [r for rows in rows_by_file.values() for r in rows
                 if r["status"] in ("survived", "not covered")]
    if survivors:
        print("\nsurvivors:")
    for r in survivors:
        note = " (no test runs this line)" if r["status"] == "not covered" else ""
        print(f"  {r['path']}:{r['line']}  {r['kind']}{note}\n      {r['mutated']}")


def _report_line(name: str, rows: list[dict]) -> None:
    count = {s: sum(r["status"] == s for r in rows)
             for s in ("killed", "timeout", "survived", "not covered")}
    dead = count["killed"] + count["timeout"]
    rate = f"{100 * dead / len(rows):.1f}" if rows else "-"
    seconds = sum(r["seconds"] for r in rows)
    print(f"{name:44s} {len(rows):7d} {count['killed']:6d} {count['timeout']:5d} "
          f"{count['survived']:4d} {count['not covered']:5d} {rate:>7s} {seconds:6.0f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help="files or package folders under python/minisgl")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR,
                        help=f"the private copy the mutants are written in ({DEFAULT_WORKDIR})")
    parser.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    parser.add_argument("--fresh", action="store_true", help="forget the results of earlier runs")
    args = parser.parse_args(argv)
    files = target_files(args.targets)
    if args.list:
        for file in files:
            for m in mutants_of((ROOT / file).read_text(encoding="utf-8"), str(file)):
                print(f"{m.path}:{m.line}  {m.kind}: {m.mutated_line}")
        return 0
    workdir = args.workdir.resolve()
    if workdir == ROOT or ROOT in workdir.parents:
        sys.exit("--workdir must be outside the repository: mutants are written there")
    prepare_workdir(workdir)
    check_imports_the_copy(workdir)
    log = workdir / ".mutate" / "results.jsonl"
    if args.fresh:
        log.unlink(missing_ok=True)
    started = time.monotonic()
    baseline = measure_baseline(workdir, sorted({c for f in files for c in chapters_of(f)}))
    results = _load_results(log)
    runner, rows = ForkRunner(workdir), {}
    try:
        for file in files:
            print(f"{file}:", flush=True)
            rows[file] = mutate_file(workdir, file, baseline, results, log, runner)
    finally:
        clean = unchanged_in_git(workdir)
        print(f"\nworkdir {workdir}: " + ("every file restored (git status clean)" if clean
                                          else "FILES LEFT CHANGED: see git status there"))
    report(rows)
    print(f"\n{time.monotonic() - started:.0f} s")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
