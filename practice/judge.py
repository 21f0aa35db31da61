"""Judge a practice exercise against your code.

    python practice/judge.py ID [FILE]     judge FILE (default: your working copy,
                                           practice/work/ID.py, made from the starter)
    ID: the exercise's number, 052 or 52, its folder 052_paged_attend, or its chapter when
        that has one exercise: 17, ch17, ch17_cudagraph (as steps.py names chapters)
    python practice/judge.py --list        every exercise; the solved ones marked
    python practice/judge.py --reference ID   judge the hidden reference solution

One line per test (PASS, or FAIL and why), then the verdict. Exit status: 0 when every test
passes, 1 when one fails, 2 for bad input.

An exercise is a folder `practice/NNN_slug/` (NNN: the chapter's two digits, then the place):
`exercise.toml`, the statement `README.md`, `starter.py`, `reference.py` and `tests.py`. The
tests run in a child process (`runner.py`) with a time limit and a memory cap, so an endless
loop or a runaway allocation fails one test ("took longer than N s", "used more than N MB")
instead of hanging the learner's machine or filling its memory. `steps.py check` calls
`verify` for each chapter's exercises; the tests of the tests judge many solutions of one
exercise in one child (`judge_many`).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PRACTICE = Path(__file__).resolve().parent
FOLDER = re.compile(r"(\d{3})_[a-z0-9_]+")
FILES = ("exercise.toml", "README.md", "starter.py", "reference.py", "tests.py")
FIELDS = {
    "id": str,
    "title": str,
    "chapter": int,
    "difficulty": str,
    "runs": str,
    "function": str,
    "source": str,
}
DIFFICULTIES = ("easy", "medium", "hard")
RUNS = ("browser", "local")  # browser: pure Python, Pyodide runs it; local: needs torch/numpy
TEST_LIMIT_S = {"browser": 5, "local": 60}  # one test; a whole exercise takes < 2 s
# The cap on the child's data (heap and private writable maps, see `runner.cap_memory`) in MB,
# and MEMORY_PER_CORE_MB more for each core. Measured (2 cores, CPU torch 2.13), the children's
# resident peaks: 16-21 MB for a pure-Python exercise; 230-280 MB for 231 and 241, whose tests
# import torch, numpy and xgrammar where they are installed (they need a cap above 300 MB: at
# 300 xgrammar's thread pool could not start and hung); 240 MB for the local 042 (torch). Each
# thread costs its 8 MB stack (ulimit -s) used or not: torch starts two a core (10.8 MB each,
# measured with 128 of them), numpy's BLAS and xgrammar one each.
MEMORY_LIMIT_MB = {"browser": 1024, "local": 2048}
MEMORY_PER_CORE_MB = 32
TIMEOUT_S = 600  # the child process, whatever its tests do
PRINTED_MAX = 2**20  # the most of what the learner's code printed that is kept and shown


def _load_runner():
    spec = importlib.util.spec_from_file_location("practice_runner", PRACTICE / "runner.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


runner = _load_runner()


class ExerciseError(Exception):
    """Bad input: an unknown exercise, a missing file, an exercise.toml that does not parse."""


@dataclass(frozen=True)
class Exercise:
    id: str
    title: str
    chapter: int
    difficulty: str
    runs: str
    functions: tuple[str, ...]  # what the learner writes ("function" in exercise.toml)
    source: str  # where the chapter's real code lives, from the repository's root
    folder: Path

    def file(self, name: str) -> Path:
        return self.folder / name

    @property
    def heading(self) -> str:
        """The statement's first line."""
        return f"# {self.id} · {self.title} ({self.difficulty})"

    @property
    def working_copy(self) -> Path:
        return self.folder.parent / "work" / f"{self.id}.py"


# --- the exercises ----------------------------------------------------------------------------


def folders(practice: Path = PRACTICE) -> dict[str, Path]:
    """Exercise id -> its folder, for every `NNN_slug` folder."""
    found = {}
    for folder in sorted(practice.iterdir()) if practice.is_dir() else []:
        match = FOLDER.fullmatch(folder.name)
        if match and folder.is_dir():
            if match.group(1) in found:
                raise ExerciseError(
                    f"two folders for exercise {match.group(1)}: "
                    f"{found[match.group(1)].name} and {folder.name}"
                )
            found[match.group(1)] = folder
    return found


def load(folder: Path) -> Exercise:
    """The exercise in `folder`, its exercise.toml checked field by field."""
    path = folder / "exercise.toml"
    if not path.is_file():
        raise ExerciseError(f"{folder.name}: no exercise.toml")
    data = _read_toml(path)
    where = f"{folder.name}/exercise.toml"
    for key, kind in FIELDS.items():
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            raise ExerciseError(f"{where}: {key} must be a {kind.__name__}")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise ExerciseError(f"{where}: unknown field {unknown[0]!r}")
    number = folder.name[:3]
    if data["id"] != number:
        raise ExerciseError(f"{where}: id is {data['id']!r}, but the folder says {number}")
    if data["chapter"] != int(number[:2]):
        raise ExerciseError(
            f"{where}: chapter is {data['chapter']}, but id {number} says {int(number[:2])}"
        )
    for key, allowed in (("difficulty", DIFFICULTIES), ("runs", RUNS)):
        if data[key] not in allowed:
            raise ExerciseError(f"{where}: {key} must be one of {', '.join(allowed)}")
    functions = tuple(name.strip() for name in data["function"].split(","))
    if not all(name.isidentifier() for name in functions):
        raise ExerciseError(f"{where}: function must name Python functions: {data['function']!r}")
    return Exercise(
        data["id"],
        data["title"],
        data["chapter"],
        data["difficulty"],
        data["runs"],
        functions,
        data["source"],
        folder,
    )


def _read_toml(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: exercise.toml is flat `key = value` lines
        return _flat_toml(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ExerciseError(f"{path.parent.name}/exercise.toml: {e}") from None


def _flat_toml(path: Path) -> dict:
    data: dict = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            key, equals, value = line.partition("=")
            try:
                data[key.strip()] = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                equals = ""
            if not equals:
                raise ExerciseError(f"{path.parent.name}/exercise.toml:{number}: not key = value")
    return data


def exercises(practice: Path = PRACTICE) -> list[Exercise]:
    return [load(folder) for folder in folders(practice).values()]


def find(name: str, practice: Path = PRACTICE) -> Exercise:
    """The exercise `name` names: its id (`052`, or `52` without the zero), its folder
    (`052_paged_attend`) or slug (`paged_attend`); or a chapter that has just one exercise,
    named as `steps.py` names chapters (`5`, `05`, `ch05`, `ch05_kvcache`)."""
    known = folders(practice)
    exercise = _exercise_named(name, known)
    chapter = _chapter_named(name, practice.parent / "chapters")
    in_chapter = [i for i in known if chapter is not None and int(i[:2]) == chapter]
    if exercise is not None and chapter is not None and in_chapter:
        raise ExerciseError(
            f"{name!r} names exercise {exercise} and chapter {chapter} (exercises "
            f"{', '.join(in_chapter)}): write {exercise} for the exercise, ch{chapter:02d} for "
            "the chapter"
        )
    if exercise is not None:
        return load(known[exercise])
    if len(in_chapter) == 1:
        return load(known[in_chapter[0]])
    if in_chapter:
        raise ExerciseError(
            f"chapter {chapter} has {len(in_chapter)} exercises, {', '.join(in_chapter)}: "
            f"name one, e.g. judge.py {in_chapter[0]}"
        )
    listed = ", ".join(known) or "none yet"
    raise ExerciseError(f"no exercise {name!r} (exercises: {listed})")


def _exercise_named(name: str, known: dict[str, Path]) -> str | None:
    """The id of the exercise whose id, number, folder or slug `name` is."""
    if name.isdigit() and f"{int(name):03d}" in known:
        return f"{int(name):03d}"
    for exercise_id, folder in known.items():
        if name in (folder.name, folder.name.removeprefix(f"{exercise_id}_")):
            return exercise_id
    return None


def _chapter_named(name: str, chapters: Path) -> int | None:
    """The chapter `name` names as steps.py does (`5`, `05`, `ch5`, `ch05`) or by its folder
    (`ch05_kvcache`, checked against `chapters/` where the book has one); three digits are an
    exercise's id, never a chapter."""
    if re.fullmatch(r"\d{1,2}|ch\d+", name):
        return int(name.removeprefix("ch"))
    named = re.fullmatch(r"ch(\d+)_[a-z0-9_]+", name)
    if named and (not chapters.is_dir() or (chapters / name).is_dir()):
        return int(named.group(1))
    return None


# --- judging ----------------------------------------------------------------------------------


def judge(exercise: Exercise, solution: Path) -> tuple[list, str]:
    """Run the exercise's tests on `solution` in a child process: (outcomes, what the learner's
    code printed). The child is cut off after TIMEOUT_S; it caps its own memory at
    `memory_cap_mb`, where the system can (the runner fails the test that goes past it; a
    child that crashes or sticks there is reported here)."""
    limit = TIMEOUT_S
    memory_mb = memory_cap_mb(exercise.runs) if _CAN_CAP else None
    command = [
        sys.executable,
        str(PRACTICE / "runner.py"),
        str(solution.resolve()),
        str(exercise.file("tests.py")),
        str(TEST_LIMIT_S[exercise.runs]),
    ]
    command += [] if memory_mb is None else [str(memory_mb)]
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
    child = _run_child(command, env, exercise.folder, limit)
    try:
        result = json.loads(child.stdout)
    except ValueError:
        # A child at its cap may be stuck rather than dead (a library whose thread could not
        # start waits for it for ever), so a timeout there is the memory's fault too.
        if memory_mb is not None and _ran_out_of_memory(child, MEMORY_LIMIT_MB[exercise.runs]):
            message = (
                f"the tests used more than {memory_mb:g} MB (a list or a loop that "
                "grows without end?)"
            )
            return [runner.Outcome("memory", False, message)], child.stderr
        if child.returncode is None:
            message = f"the tests took longer than {limit:g} s (an endless loop?)"
            return [runner.Outcome("timeout", False, message)], child.stderr
        last = (child.stderr.strip().splitlines() or [_ended(child.returncode)])[-1]
        return [runner.Outcome("runner", False, f"the judge crashed: {last}")], child.stderr
    return [runner.Outcome(**o) for o in result["outcomes"]], child.stderr


def judge_many(exercise: Exercise, solutions: list[Path]) -> list[list]:
    """The outcomes of each of `solutions`, as `judge` gives them, judged one after another in
    one child process with the same limits: its start and the imports of the exercise's tests
    (torch, for some: 1-2 s) are paid once. They share that process's imported libraries, as
    tests in one pytest process do; each gets a fresh module of its own and of the tests. The
    solution the child was on when it crashed, stuck or died at the cap, and those after it,
    are judged again each in a child of its own, so that the blame lands where it belongs."""
    if not solutions:
        return []
    memory_mb = memory_cap_mb(exercise.runs) if _CAN_CAP else None
    command = [
        sys.executable,
        str(PRACTICE / "runner.py"),
        "--many",
        str(exercise.file("tests.py")),
        str(TEST_LIMIT_S[exercise.runs]),
        "-" if memory_mb is None else str(memory_mb),
        *(str(solution.resolve()) for solution in solutions),
    ]
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
    child = _run_child(command, env, exercise.folder, TIMEOUT_S)
    judged: list[list] = []
    for line in child.stdout.splitlines()[: len(solutions)]:
        try:
            judged.append([runner.Outcome(**o) for o in json.loads(line)["outcomes"]])
        except (ValueError, KeyError, TypeError):  # cut short, or the learner's own output
            break
    return judged + [judge(exercise, solution)[0] for solution in solutions[len(judged) :]]


def memory_cap_mb(runs: str) -> int:
    """The memory cap of a child that judges an exercise that `runs` there."""
    return MEMORY_LIMIT_MB[runs] + MEMORY_PER_CORE_MB * (os.cpu_count() or 1)


_CAN_CAP = importlib.util.find_spec("resource") is not None  # no `resource` on Windows
MEMORY_WORDS = ("MemoryError", "Cannot allocate memory", "can't allocate memory", "bad_alloc")


@dataclass
class _Child:
    returncode: int | None  # None: cut off after the timeout
    stdout: str
    stderr: str  # its last PRINTED_MAX bytes
    peak_mb: float | None  # its largest resident size, where the system tells


def _run_child(command: list[str], env: dict, cwd: Path, timeout_s: float) -> _Child:
    """Run `command` to its end or to the timeout. Its output goes to files, not pipes, and
    only its tail is read back: a printing loop does not fill this process's memory."""
    if not hasattr(os, "wait4"):  # Windows: no resource use to read
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd
            )
        except subprocess.TimeoutExpired as e:
            return _Child(None, "", _text(e.stderr or b""), None)
        return _Child(done.returncode, done.stdout, done.stderr[-PRINTED_MAX:], None)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=cwd)
        status, usage, sampled_mb = _wait(process, timeout_s, command[1])
        out.seek(0)
        err.seek(max(0, err.seek(0, os.SEEK_END) - PRINTED_MAX))
        stdout, stderr = _text(out.read()), _text(err.read())
    if sampled_mb is not None or os.path.isdir("/proc/self"):
        return _Child(status, stdout, stderr, sampled_mb)
    # elsewhere ru_maxrss (bytes on macOS), which also counts what the child had of this
    # process's memory when it was forked
    peak_mb = usage.ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)
    return _Child(status, stdout, stderr, peak_mb)


def _wait(
    process: subprocess.Popen, timeout_s: float, program: str
) -> tuple[int | None, object, float | None]:
    """(exit status, or None when it ran past the timeout and was killed; its resource use;
    its peak resident size as sampled while it ran, where /proc tells), reaped with os.wait4."""
    deadline, pause, killed, peak_mb = time.monotonic() + timeout_s, 0.001, False, None
    try:
        while True:
            sample = _peak_so_far_mb(process.pid, program)
            peak_mb = peak_mb if sample is None else max(sample, peak_mb or 0.0)
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                process.kill()
                _, status, usage = os.wait4(process.pid, 0)
                killed = True
                break
            time.sleep(pause)
            pause = min(2 * pause, 0.05)  # quick for quick children, cheap for slow ones
    except BaseException:  # Ctrl-C in the judge: the child goes too
        process.kill()
        process.wait()
        raise
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait
    return (None if killed else process.returncode), usage, peak_mb


def _peak_so_far_mb(pid: int, program: str) -> float | None:
    """The child's peak resident size so far (Linux's VmHWM), once it runs ``program``. Not
    wait4's ru_maxrss: that also counts the memory the child shared with this process when it
    was forked, and a large judge (pytest, or the warm Python of steps.py check) would lend
    it to every child, which would then look as if it had reached its cap."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            if program.encode() not in cmdline.read():
                return None  # still this process's copy, before it starts the runner
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return None


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _ran_out_of_memory(child: _Child, base_mb: float) -> bool:
    """A child that ended with no result: at its memory cap, or saying it ran out? (A crash
    at the cap need not say so: C code that gets no memory may just abort.) Its peak is
    resident memory, which leaves out its threads' untouched stacks, the per-core part of the
    cap: at the cap it is near `base_mb` or above."""
    if any(word in child.stderr[-4000:] for word in MEMORY_WORDS):
        return True
    return child.peak_mb is not None and child.peak_mb >= 0.9 * base_mb


def _ended(returncode: int) -> str:
    if returncode < 0:
        return f"its process was killed by signal {-returncode}"
    return f"its process ended with status {returncode} and no output"


def problems(exercise: Exercise, repository: Path) -> list[str]:
    """What is wrong with the exercise's files, without running them."""
    found = [f"{name} is missing" for name in FILES if not exercise.file(name).is_file()]
    if found:
        return found
    first = exercise.file("README.md").read_text(encoding="utf-8").split("\n", 1)[0]
    if first.strip() != exercise.heading:
        found.append(f"README.md begins {first!r}, not {exercise.heading!r}")
    if not (repository / exercise.source).is_file():
        found.append(f"source {exercise.source} does not exist")
    for name in ("starter.py", "reference.py", "tests.py"):
        found += _source_problems(exercise, name)
    return found


def _source_problems(exercise: Exercise, name: str) -> list[str]:
    try:
        tree = ast.parse(exercise.file(name).read_text(encoding="utf-8"), name)
    except SyntaxError as e:
        return [f"{name} does not parse: {e.msg} (line {e.lineno})"]
    found = []
    if name != "tests.py":
        defined = {
            node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
        }
        found += [f"{name} does not define {f}" for f in exercise.functions if f not in defined]
    elif not any(isinstance(n, ast.FunctionDef) and n.name.startswith("test_") for n in tree.body):
        found.append("tests.py has no test_ function")
    if exercise.runs == "browser":
        outside = sorted(_imports(tree) - set(sys.stdlib_module_names))
        found += [f"{name} imports {m}: a browser exercise is pure Python" for m in outside]
    return found


def _imports(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def verify(exercise: Exercise, repository: Path) -> list[str]:
    """Everything `steps.py check` asks of an exercise: its files, then that the starter fails
    and the reference passes."""
    found = problems(exercise, repository)
    if found:
        return found
    starter, _ = judge(exercise, exercise.file("starter.py"))
    if runner.all_passed(starter):
        found.append("the starter passes the tests")
    reference, _ = judge(exercise, exercise.file("reference.py"))
    found += [f"the reference fails {o.name}: {o.message}" for o in reference if not o.passed]
    return found


# --- the command line -------------------------------------------------------------------------


def _shown(path: Path) -> str:
    """Relative to where the learner stands when it is below it."""
    path = path.resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def cmd_judge(exercise: Exercise, file: Path | None, reference: bool) -> int:
    if reference:
        file = exercise.file("reference.py")
    elif file is None:
        file = exercise.working_copy
        if not file.exists():
            file.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(exercise.file("starter.py"), file)
            print(f"created {_shown(file)} from the starter: write your solution there")
    if not file.is_file():
        raise ExerciseError(f"no file {_shown(file)}")
    print(f"judging {_shown(file)}: {exercise.id} · {exercise.title} ({exercise.difficulty})")
    outcomes, printed = judge(exercise, file)
    if printed.strip():
        print("your code printed:\n" + printed.rstrip())
    for line in runner.report(outcomes):
        print(line)
    return 0 if runner.all_passed(outcomes) else 1


def cmd_list() -> int:
    rows = [("id", "chapter", "difficulty", "runs", "solved", "title")]
    for exercise_id, folder in folders().items():
        try:
            exercise = load(folder)
        except ExerciseError as e:
            rows.append((exercise_id, "", "", "", "", f"(invalid: {e})"))
            continue
        rows.append(
            (
                exercise.id,
                str(exercise.chapter),
                exercise.difficulty,
                exercise.runs,
                _solved(exercise),
                exercise.title,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print("solved: yes when practice/work/ID.py passes, no when it does not, - when not begun")
    return 0


def _solved(exercise: Exercise) -> str:
    if not exercise.working_copy.is_file():
        return "-"
    outcomes, _ = judge(exercise, exercise.working_copy)
    return "yes" if runner.all_passed(outcomes) else "no"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, status 2
        raise ExerciseError(f"{message} (see --help)")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="judge.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("id", nargs="?", help="the exercise, e.g. 171")
    parser.add_argument("file", nargs="?", type=Path, help="your solution")
    parser.add_argument("--list", action="store_true", help="every exercise")
    parser.add_argument("--reference", action="store_true", help="judge the reference")
    try:
        args = parser.parse_args(argv)
        if args.list:
            return cmd_list()
        if args.id is None:
            raise ExerciseError("name an exercise, e.g. judge.py 171 (or --list)")
        if args.reference and args.file:
            raise ExerciseError("--reference judges the reference: give no FILE")
        return cmd_judge(find(args.id), args.file, args.reference)
    except ExerciseError as e:
        print(f"judge.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
