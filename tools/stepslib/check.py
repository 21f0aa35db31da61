"""`check`: each chapter's steps, cached by what its result depends on, run in parallel.

The steps of a chapter:
  1. steps.yaml is consistent (done when the book is loaded; a problem there is bad input);
  2. the package is closed: every `minisgl` import names a module and a name of the tree, and
     imports run down steps.yaml's `layers` only (`if TYPE_CHECKING:` aside);
  3. the main's prints equal the recorded ones;
  4. the chapter's tests pass on its tree (with `cumulative`, every test up to it);
  5. every directive of the chapter's text resolves;
  6. the chapter's practice exercises (`practice/NNN_slug/`, NNN starting with the chapter's
     number) are sound: exercise.toml's fields, the statement's first line, the starter fails
     the tests and the reference passes them (practice/judge.py's `verify`).

A tree whose tests fail is kept under .steps-cache/trees/ until the chapter passes, so that the
command the report prints can re-run its first failing test by hand.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import platform
import shlex
import shutil
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, TextIO

from . import runner
from .book import Book, Chapter
from .imports import Closure, Forward, Layers, Problem, module_name
from .render import PRINTS, TEXT, text_problems
from .tree import package_files, tree_at, write_tree
from .warm import WarmPython

CACHE = ".steps-cache/results"
SECONDS = ".steps-cache/seconds.json"  # what each chapter took when last run: longest go first
TREES = ".steps-cache/trees"  # a chapter's tree, kept while its tests fail, to re-run them in
TOOL_DIR = Path(__file__).resolve().parent
PRACTICE = "practice"
JUDGE = f"{PRACTICE}/judge.py"


@dataclass
class Options:
    static: bool = False
    cumulative: bool = False
    use_cache: bool = True
    against: Path | None = None  # a learner's tree: DIR/python holds their package
    no_skip: bool = False  # CI: a CPU chapter whose packages are missing fails, never skips
    tool: str = "python tools/steps.py"  # how the reader runs this tool, for the commands shown


@dataclass
class Result:
    chapter: Chapter
    status: str = "pass"  # pass | fail | skip
    reason: str = ""  # why it was skipped
    steps: dict[str, str] = field(default_factory=dict)  # step -> what came of it
    details: list[tuple[str, str]] = field(default_factory=list)  # (heading, what explains it)
    failed: list[str] = field(default_factory=list)  # the steps that failed
    forwards: list[Forward] = field(default_factory=list)
    tests: list[runner.Test] = field(default_factory=list)
    cached: bool = False
    seconds: float = 0.0

    def fail(self, step: str, outcome: str, detail: str, heading: str = "") -> None:
        """`heading` says what the detail is; by default the step and its outcome."""
        self.status = "fail"
        self.steps[step] = outcome
        self.failed.append(step)
        self.details.append((heading or f"{step}: {outcome}", detail))


def check_chapter(
    book: Book, chapter: Chapter, options: Options, warm: WarmPython | None = None
) -> Result:
    result = Result(chapter)
    if chapter.requires == "gpu" and not runner.has_gpu():
        return Result(chapter, "skip", "needs a GPU")
    missing = runner.missing_needs(chapter)
    if missing and not options.static:
        if options.no_skip:
            result.fail("needs", "missing", f"needs {', '.join(missing)}, not installed")
            return result
        return Result(chapter, "skip", f"needs {', '.join(missing)}")
    if options.against is None:
        _check_closure(book, chapter, result)
    problems = text_problems(book, chapter)
    result.steps["text"] = "ok" if not problems else f"{len(problems)} unresolved"
    if problems:
        result.fail("text", result.steps["text"], "\n".join(map(str, problems)))
    if options.against is None:
        _check_practice(book, chapter, result)
    if not options.static:
        with tempfile.TemporaryDirectory(prefix=f"steps-{chapter.id}-") as scratch:
            tree = Path(scratch)
            write_tree(tree_at(book, chapter, package=options.against is None), tree)
            python = options.against / "python" if options.against else tree / "python"
            _check_main(book, chapter, tree, python, options, result, warm)
            _check_tests(book, chapter, tree, python, options, result, warm)
            _keep_while_failing(tree, kept_tree(book, chapter, options), result)
    return result


def _check_closure(book: Book, chapter: Chapter, result: Result) -> None:
    files = _package_sources(book, chapter)
    shown = {source: source.relative_to(book.root).as_posix() for source in files.values()}
    main = book.root / chapter.main
    shown[main] = chapter.main
    closure = Closure(files, shown)
    targets = [(source, module_name(p)) for p, source in files.items() if p.endswith(".py")]
    problems: list[Problem] = []
    for source, module in [*targets, (main, "")]:  # the main is outside the package
        found, forwards = closure.check(source, module, chapter.number)
        problems += found
        result.forwards += forwards
    if book.layers:
        layers = Layers(book.layers, shown)
        problems += [p for source, module in targets for p in layers.check(source, module)]
    result.steps["imports"] = "ok" if not problems else f"{len(problems)} broken"
    if problems:
        result.fail("imports", result.steps["imports"], "\n".join(map(str, problems)))


def _package_sources(book: Book, chapter: Chapter) -> dict[str, Path]:
    tree = tree_at(book, chapter)
    return {p: tree[f"{book.package_root}/{p}"] for p in package_files(book, chapter)}


def _check_practice(book: Book, chapter: Chapter, result: Result) -> None:
    """Every exercise of the chapter, verified by the book's own judge; none is not a failure."""
    judge = _judge(book)
    if judge is None:
        return
    try:
        folders = _exercise_folders(book, chapter, judge)
    except judge.ExerciseError as e:
        result.fail("practice", "invalid", str(e))
        return
    problems = []
    for folder in folders:
        try:
            found = judge.verify(judge.load(folder), book.root)
        except judge.ExerciseError as e:  # it names the file: NNN_slug/exercise.toml
            problems.append(f"{PRACTICE}/{e}")
            continue
        problems += [f"{PRACTICE}/{folder.name}: {problem}" for problem in found]
    if not folders:
        return
    result.steps["practice"] = f"{len(folders)} ok" if not problems else f"{len(problems)} wrong"
    if problems:
        result.fail("practice", result.steps["practice"], "\n".join(problems))


def _exercise_folders(book: Book, chapter: Chapter, judge: Any) -> list[Path]:
    found = judge.folders(book.root / PRACTICE)
    return [
        folder for exercise_id, folder in found.items() if int(exercise_id[:2]) == chapter.number
    ]


_judges: dict[Path, Any] = {}
_judges_lock = threading.Lock()


def _judge(book: Book) -> Any:
    """The book's practice/judge.py as a module (None for a book without one), loaded once."""
    path = book.root / JUDGE
    if not path.is_file():
        return None
    with _judges_lock:
        if path not in _judges:
            name = "steps_judge_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            _judges[path] = module
        return _judges[path]


def _check_main(
    book: Book,
    chapter: Chapter,
    tree: Path,
    python: Path,
    options: Options,
    result: Result,
    warm: WarmPython | None,
) -> None:
    gpu = chapter.requires == "gpu"
    outcome = runner.run_main(tree, chapter.main, python, gpu, warm)
    prints = f"{chapter.folder}/{PRINTS}"
    run = f"{options.tool} run {chapter.id}" + (
        f" --against {shlex.quote(str(options.against))}" if options.against else ""
    )
    if not outcome.ok:
        result.fail(
            "main",
            "failed",
            f"{outcome.detail.rstrip()}\n\nrun it yourself: {run}",
            f"main: {chapter.main} failed",
        )
        return
    recorded_path = book.root / prints
    if not recorded_path.is_file():
        result.fail(
            "main", "no prints", f"{prints} is missing: run `{options.tool} record {chapter.id}`"
        )
        return
    recorded = recorded_path.read_text(encoding="utf-8")
    if runner.same_prints(recorded, outcome.output, chapter.tolerance):
        result.steps["main"] = "ok"
        return
    printed = "printed by your tree" if options.against else "printed now"
    diff = runner.prints_diff(recorded, outcome.output, prints, ("recorded", printed))
    result.fail(
        "main",
        "differs",
        f"{diff}\nsee all it prints: {run}",
        f"main: {runner.lines_differing(recorded, outcome.output)} from {PRINTS}",
    )


def _check_tests(
    book: Book,
    chapter: Chapter,
    tree: Path,
    python: Path,
    options: Options,
    result: Result,
    warm: WarmPython | None,
) -> None:
    chapters = book.upto(chapter) if options.cumulative else [chapter]
    tests = [t for c in chapters for t in c.tests]
    if not tests:
        result.fail("tests", "none", f"{chapter.id} lists no tests")
        return
    outcome = runner.run_tests(tree, tests, python, chapter.requires == "gpu", warm)
    result.tests = outcome.tests
    if outcome.ok:
        result.steps["tests"] = outcome.summary
        return
    first = outcome.first_failure
    again = rerun_command(
        kept_tree(book, chapter, options), options.against, [first] if first else tests
    )
    what = "the first failing test (shown whole above)" if first else "the tests"
    result.fail(
        "tests",
        outcome.summary,
        f"{outcome.detail.rstrip()}\n\nre-run {what} by hand:\n  {again}",
        f"tests: {outcome.summary}",
    )


def kept_tree(book: Book, chapter: Chapter, options: Options) -> Path:
    """Where the tree is kept while the chapter's tests fail (a learner's apart from the book's)."""
    return book.root / TREES / (chapter.name + ("-yours" if options.against else ""))


def _keep_while_failing(tree: Path, kept: Path, result: Result) -> None:
    shutil.rmtree(kept, ignore_errors=True)
    if "tests" in result.failed:
        shutil.copytree(tree, kept)


def rerun_command(tree: Path, against: Path | None, tests: list[str]) -> str:
    """A shell command that runs `tests` (node ids or files) in a kept tree, as check ran them."""
    python_path = shlex.quote(str(against / "python")) if against else "python"
    return (
        f"cd {shlex.quote(str(tree))} && PYTHONPATH={python_path} "
        f"{python_command()} -m pytest " + " ".join(map(shlex.quote, tests))
    )


def python_command() -> str:
    """`python` where that is this interpreter (the same virtualenv), else this one's path."""
    found = shutil.which("python")
    same = found is not None and Path(found).parent == Path(sys.executable).parent
    return "python" if same else shlex.quote(sys.executable)


# --- the cache --------------------------------------------------------------------------------


def cache_key(book: Book, chapter: Chapter, options: Options) -> str:
    """A digest of everything the chapter's result depends on."""
    digest = hashlib.sha256()
    for part in _environment():
        digest.update(part.encode() + b"\0")
    digest.update(repr((chapter, book.package_root, options.static, options.cumulative)).encode())
    sources = dict(tree_at(book, chapter))
    for name in (TEXT, PRINTS):
        sources[f"{chapter.folder}/{name}"] = book.root / chapter.folder / name
    practice = book.root / PRACTICE
    exercises = practice.glob(f"{chapter.number:02d}[0-9]_*/**/*") if practice.is_dir() else []
    for path in [practice / "judge.py", practice / "runner.py", *exercises]:
        if path.is_file() and "__pycache__" not in path.parts:
            sources[path.relative_to(book.root).as_posix()] = path
    for path, source in sorted(sources.items()):
        digest.update(f"{path}\0{_file_digest(source)}\0".encode())
    return digest.hexdigest()


_digests: dict[tuple[Path, int, int], str] = {}


def _file_digest(path: Path) -> str:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return "missing"
    key = (path, stat.st_mtime_ns, stat.st_size)
    if key not in _digests:
        _digests[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _digests[key]


def _environment() -> list[str]:
    """The tool's own source and the versions a result depends on."""
    parts = [sys.version, platform.machine()]
    for name in ("torch", "transformers", "tokenizers", "triton", "pytest"):
        try:
            parts.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{name} missing")
    for source in sorted(TOOL_DIR.glob("*.py")) + [TOOL_DIR.parent / "steps.py"]:
        parts.append(_file_digest(source))
    return parts


def _cached(book: Book, key: str) -> dict | None:
    path = book.root / CACHE / f"{key}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _store(book: Book, key: str, result: Result) -> None:
    folder = book.root / CACHE
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "steps": result.steps,
        "tests": result.tests,
        "forwards": [[f.where, f.module, f.chapter] for f in result.forwards],
    }
    partial = folder / f"{key}.json.part"
    partial.write_text(json.dumps(record), encoding="utf-8")
    partial.replace(folder / f"{key}.json")


def _expected_seconds(recorded: dict[str, float], chapter: Chapter) -> tuple[float, int]:
    """What the chapter took last time; never run, it comes first, later chapters (the heavier
    ones) before earlier. Longest first leaves the short ones to fill the last gaps."""
    return recorded.get(chapter.id, float("inf")), chapter.number


def _seconds(book: Book) -> dict[str, float]:
    try:
        return json.loads((book.root / SECONDS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _record_seconds(book: Book, chapter: Chapter, seconds: float) -> None:
    path = book.root / SECONDS
    recorded = {**_seconds(book), chapter.id: round(seconds, 1)}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".part")  # replaced whole: a reader never sees half of it
    partial.write_text(json.dumps(recorded, sort_keys=True), encoding="utf-8")
    partial.replace(path)


def _from_cache(chapter: Chapter, record: dict) -> Result:
    return Result(
        chapter,
        steps=record["steps"],
        tests=[tuple(t) for t in record["tests"]],
        forwards=[Forward(*f) for f in record["forwards"]],
        cached=True,
    )


# --- many chapters ----------------------------------------------------------------------------


def check_book(
    book: Book, chapters: list[Chapter], options: Options, jobs: int, progress: TextIO
) -> list[Result]:
    """Check `chapters`, `jobs` at a time, showing progress; results in chapter order."""
    results: dict[str, Result] = {}
    todo: list[tuple[Chapter, str | None]] = []
    for chapter in chapters:
        key = cache_key(book, chapter, options) if options.against is None else None
        record = _cached(book, key) if key and options.use_cache else None
        if record is not None:
            results[chapter.id] = _from_cache(chapter, record)
            shutil.rmtree(kept_tree(book, chapter, options), ignore_errors=True)  # it passes
        else:
            todo.append((chapter, key))
    recorded = _seconds(book)
    todo.sort(key=lambda item: _expected_seconds(recorded, item[0]), reverse=True)
    display = _Progress(progress, len(chapters), len(results))
    workers = max(1, jobs)
    with _warm_python(book, todo, options) as warm, ThreadPoolExecutor(workers) as pool:
        futures = {
            pool.submit(_timed, display, book, c, options, warm): (c, key) for c, key in todo
        }
        for future in as_completed(futures):
            chapter, key = futures[future]
            result = future.result()
            results[chapter.id] = result
            display.done(result)
            if key and result.status == "pass":
                _store(book, key, result)
            if result.status != "skip":
                _record_seconds(book, chapter, result.seconds)
    display.close()
    return [results[c.id] for c in chapters]


@contextlib.contextmanager
def _warm_python(
    book: Book, todo: list[tuple[Chapter, str | None]], options: Options
) -> Iterator[WarmPython | None]:
    """A warm server for the mains and tests to come, when the book names modules to preload and
    some chapters will run off the GPU."""
    cpu = [chapter for chapter, _ in todo if chapter.requires != "gpu"]
    if options.static or not book.preload or not cpu:
        yield None
        return
    warm = WarmPython(runner.server_env(), book.preload)
    try:
        yield warm
    finally:
        warm.close()


def _timed(
    display: _Progress, book: Book, chapter: Chapter, options: Options, warm: WarmPython | None
) -> Result:
    display.start(chapter)
    start = time.monotonic()
    try:
        result = check_chapter(book, chapter, options, warm)
    except Exception as e:  # a crash of one chapter's check is that chapter's failure
        result = Result(chapter)
        result.fail("check", "crashed", f"{type(e).__name__}: {e}")
    result.seconds = time.monotonic() - start
    return result


class _Progress:
    """A live line on a terminal; one line per finished chapter elsewhere."""

    def __init__(self, stream: TextIO, total: int, done: int):
        self.stream, self.total, self.finished = stream, total, done
        self.running: list[str] = []
        self.live = stream.isatty()
        self.lock = threading.Lock()

    def start(self, chapter: Chapter) -> None:
        with self.lock:
            self.running.append(chapter.id)
            self._draw()

    def done(self, result: Result) -> None:
        with self.lock:
            self.running.remove(result.chapter.id)
            self.finished += 1
            line = f"[{self.finished}/{self.total}] {result.chapter.id} {result.status}"
            line += f" ({result.seconds:.1f} s)" if result.status != "skip" else ""
            if self.live:
                self.stream.write("\r\033[K" + line + "\n")
                self._draw()
            else:
                self.stream.write(line + "\n")
            self.stream.flush()

    def _draw(self) -> None:
        if self.live and self.running:
            self.stream.write(
                f"\r\033[K[{self.finished}/{self.total}] running " + " ".join(self.running)
            )
            self.stream.flush()

    def close(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()


def summary_table(results: list[Result]) -> str:
    rows = [("chapter", "title", "imports", "main", "tests", "text", "practice", "result")]
    for r in results:
        status = "skipped" if r.status == "skip" else r.status
        outcome = status + (f": {r.reason}" if r.reason else "") + (" (cached)" * r.cached)
        rows.append(
            (
                r.chapter.id,
                r.chapter.title[:34],
                r.steps.get("imports", "-"),
                r.steps.get("main", "-"),
                r.steps.get("tests", "-"),
                r.steps.get("text", "-"),
                r.steps.get("practice", "-"),
                outcome,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + _counts(results)) + "\n"


def _counts(results: list[Result]) -> list[str]:
    """Chapters and their tests by outcome, and why tests were skipped, most often first."""
    chapters = {s: sum(r.status == s for r in results) for s in ("pass", "fail", "skip")}
    tests = [test for r in results for test in r.tests]
    outcomes = {
        s: sum(outcome == s for _, outcome, _ in tests)
        for s in ("passed", "failed", "skipped", "xfailed")
    }
    line = (
        f"chapters: {chapters['pass']} passed, {chapters['fail']} failed, "
        f"{chapters['skip']} skipped"
    )
    if tests:
        line += (
            f"; their tests: {outcomes['passed']:,} passed, {outcomes['failed']:,} failed, "
            f"{outcomes['skipped']:,} skipped"
            + (f", {outcomes['xfailed']:,} xfailed" if outcomes["xfailed"] else "")
        )
    reasons = Counter(
        why or "(no reason given)" for _, outcome, why in tests if outcome == "skipped"
    )
    lines = [line]
    if reasons:
        lines.append("tests skipped, by reason:")
        by_count = sorted(reasons.items(), key=lambda item: (-item[1], item[0]))
        lines += [f"  {n:5,}  {why}" for why, n in by_count]
    return lines


def write_junit(results: list[Result], path: Path) -> None:
    suites = ET.Element("testsuites", name="steps check")
    for r in results:
        suite = ET.SubElement(suites, "testsuite", name=r.chapter.name)
        cases = [
            (f"{r.chapter.name}.steps", step, "failed" if step in r.failed else "passed", "")
            for step in r.steps
        ]
        cases += [(f"{r.chapter.name}.tests", *test) for test in r.tests]
        failures = 0
        for classname, name, outcome, why in cases:
            case = ET.SubElement(suite, "testcase", classname=classname, name=name)
            if outcome == "failed":
                failures += 1
                ET.SubElement(
                    case, "failure", message=r.steps.get(name, "failed")
                ).text = "\n\n".join(f"{heading}\n{detail}" for heading, detail in r.details)
            elif outcome in ("skipped", "xfailed"):
                ET.SubElement(case, "skipped", message=why)
        if r.status == "skip":
            ET.SubElement(
                ET.SubElement(suite, "testcase", classname=r.chapter.name, name="chapter"),
                "skipped",
                message=r.reason,
            )
        suite.set("tests", str(len(suite)))
        suite.set("failures", str(failures))
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)
