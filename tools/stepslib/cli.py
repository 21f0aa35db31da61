"""The command line: `python tools/steps.py [--root BOOK] COMMAND ...`."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import check, installed, runner
from .book import Book, Chapter, load_book, parse_selection
from .errors import BookError
from .render import PRINTS, render_book
from .tree import diff, listing, package_files, tree_at, write_tree

DEFAULT_ROOT = Path(__file__).resolve().parents[2]
GLOBAL_INPUTS = ("steps.yaml", "tools/", "pyproject.toml")  # a change here touches every chapter

DESCRIPTION = """\
Rebuild, run and check the book chapter by chapter.

The tree at chapter N holds:
  - every package file (under steps.yaml's package_root) added by a chapter <= N or brought in
    early by one, in its newest version at or before N. The newest version of a file lives in
    <package_root>/; a version a later chapter replaced lives in the folder of the chapter that
    wrote it, chapters/<id>_<slug>/<package_root>/. A file brought in early has its own
    chapter's first version until that chapter;
  - the mains and tests of the chapters up to N;
  - the book-wide support files listed under steps.yaml's `support` (test helpers, tiny-model
    makers, pyproject.toml), the same in every tree. They may import the package's modules
    only inside functions.
A chapter is named 20, ch20 or by its folder's name, ch20_moe; a range 3-7 or ch03-ch07 is
inclusive; commas join several.
Exit status: 0 when everything checked passed (skips are listed), 1 when something failed,
2 for bad input or usage.
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, status 2
        raise BookError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="steps.py",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=DEFAULT_ROOT,
        help="the book's folder (default: the one holding tools/)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    commands.add_parser("list", help="one row per chapter")
    one = commands.add_parser("tree", help="the tree listing at a chapter")
    one.add_argument("chapter")
    out = commands.add_parser("checkout", help="write the tree at a chapter into DEST")
    out.add_argument("chapter")
    out.add_argument("dest", type=Path)
    out.add_argument("--git", action="store_true", help="one commit per chapter, tagged chNN")
    out.add_argument("--force", action="store_true", help="empty a non-empty DEST first")
    imp = commands.add_parser(
        "import", help="write an edited `checkout --git` history back into the book"
    )
    imp.add_argument("source", type=Path, metavar="DIR", help="the history's repository")
    imp.add_argument("--rev", default="HEAD", help="the last chapter's commit (default: HEAD)")
    imp.add_argument("--dry-run", action="store_true", help="say what would change, write nothing")
    imp.add_argument(
        "--force",
        action="store_true",
        help="overwrite files of the book that have uncommitted changes",
    )
    one = commands.add_parser("diff", help="unified diff of the tree from chapter N-1 to N")
    one.add_argument("chapter")
    run = commands.add_parser("run", help="run a chapter's main in its tree")
    run.add_argument("chapter")
    run.add_argument("--against", type=Path, metavar="DIR", help="a learner's tree")
    chk = commands.add_parser("check", help="check chapters (default: all)")
    chk.add_argument("chapters", nargs="?")
    chk.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    chk.add_argument("--no-cache", action="store_true")
    chk.add_argument("--static", action="store_true", help="imports and texts only, in seconds")
    chk.add_argument("--cumulative", action="store_true", help="every test up to the chapter")
    chk.add_argument("--against", type=Path, metavar="DIR", help="a learner's tree")
    chk.add_argument("--junit", type=Path, metavar="FILE")
    chk.add_argument(
        "--no-skip",
        action="store_true",
        help="a CPU chapter whose packages are missing fails instead of skipping",
    )
    rec = commands.add_parser("record", help="re-run mains and rewrite their main.out")
    rec.add_argument("chapters", nargs="+")
    mat = commands.add_parser("matrix", help="GitHub Actions matrix JSON")
    mat.add_argument("--changed-since", metavar="REF")
    ren = commands.add_parser("render", help="the chapter pages with directives expanded")
    ren.add_argument("--out", type=Path, help="default: BOOK/build/book")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        book = load_book(args.root.resolve())
        return COMMANDS[args.command](book, args)
    except BookError as e:
        print(f"steps.py: error: {e}", file=sys.stderr)
        return 2


def _one(book: Book, text: str) -> Chapter:
    chosen = parse_selection(book, text)
    if len(chosen) != 1:
        raise BookError(f"name one chapter, not {text!r}")
    return chosen[0]


def cmd_list(book: Book, args: argparse.Namespace) -> int:
    rows = [("stage", "id", "title", "files", "new", "modified", "early", "requires")]
    for c in book.chapters:
        rows.append(
            (
                c.stage,
                c.id,
                c.title,
                str(len(package_files(book, c))),
                str(len(c.new)),
                str(len(c.modified)),
                str(len(c.early)),
                c.requires,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def cmd_tree(book: Book, args: argparse.Namespace) -> int:
    print(listing(book, _one(book, args.chapter)), end="")
    return 0


def cmd_checkout(book: Book, args: argparse.Namespace) -> int:
    chapter = _one(book, args.chapter)
    dest = args.dest.resolve()
    _prepare_dest(book, dest, args.force)
    if args.git:
        from .gitout import checkout_git

        checkout_git(book, chapter, dest)
    else:
        write_tree(tree_at(book, chapter), dest)
    print(
        f"wrote the tree at {chapter.id} to {dest}"
        + (
            f" (git: a commit per chapter, tagged {book.chapters[0].id}..{chapter.id})"
            if args.git
            else ""
        )
    )
    print(f"run its main: cd {dest} && PYTHONPATH=python python {chapter.main}")
    return 0


def cmd_import(book: Book, args: argparse.Namespace) -> int:
    from .gitin import import_git

    lines = import_git(book, args.source.resolve(), args.rev, args.force, args.dry_run)
    for line in lines:
        print(line)
    changes = [line for line in lines if not line.startswith("kept ")]
    if not changes:
        print("nothing to change: the history is the book")
    elif args.dry_run:
        print(f"{len(changes)} changes (dry run: nothing written)")
    else:
        print(f"{len(changes)} changes written; every chapter's tree is its commit again")
    return 0


def _prepare_dest(book: Book, dest: Path, force: bool) -> None:
    """An empty (or new) folder to write into; with force, emptied. Never anything else."""
    if dest.exists() and not dest.is_dir():
        raise BookError("exists and is not a folder", str(dest))
    if dest == Path(dest.anchor) or dest in (book.root, *book.root.parents):
        raise BookError("refusing to write into the book or a folder that holds it", str(dest))
    if dest.is_dir() and any(dest.iterdir()):
        if not force:
            raise BookError("is not empty (use --force to replace what it holds)", str(dest))
        for entry in dest.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    dest.mkdir(parents=True, exist_ok=True)


def cmd_diff(book: Book, args: argparse.Namespace) -> int:
    sys.stdout.write(diff(book, _one(book, args.chapter)))
    return 0


def cmd_run(book: Book, args: argparse.Namespace) -> int:
    """Run the main; on a learner's tree, its prints are shown as they come, then judged."""
    chapter = _one(book, args.chapter)
    against = _learner_tree(book, args.against) if args.against else None
    with tempfile.TemporaryDirectory(prefix=f"steps-{chapter.id}-") as scratch:
        tree = Path(scratch)
        write_tree(tree_at(book, chapter, package=against is None), tree)
        python = against / "python" if against else tree / "python"
        env = runner.fixed_env(python, chapter.requires == "gpu")
        if against is None:
            return (
                0
                if subprocess.run([sys.executable, chapter.main], cwd=tree, env=env).returncode == 0
                else 1
            )
        returncode, printed = _run_echoing([sys.executable, chapter.main], tree, env)
    return 0 if _verdict(book, chapter, returncode, printed) else 1


def _run_echoing(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """Run `command`, its stdout shown line by line as it comes and returned whole."""
    lines = []
    with subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, text=True, encoding="utf-8"
    ) as process:
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
    return process.returncode, "".join(lines)


def _verdict(book: Book, chapter: Chapter, returncode: int, printed: str) -> bool:
    """Say how the prints of a learner's tree compare with the book's; True when the same."""
    prints = f"{chapter.folder}/{PRINTS}"
    recorded_path = book.root / prints
    if returncode != 0:
        print(f"\n── {chapter.main} exited with status {returncode} (its error is above) ──")
    elif not recorded_path.is_file():
        print(f"\n── no recorded prints to compare with: {prints} is missing ──")
    else:
        recorded = recorded_path.read_text(encoding="utf-8")
        if recorded == printed:
            print(f"\n── your tree prints what {prints} holds, line for line ──")
            return True
        if runner.same_prints(recorded, printed, chapter.tolerance):
            print(
                f"\n── your tree prints what {prints} holds, its numbers within the "
                f"chapter's tolerance of {chapter.tolerance:g} ──"
            )
            return True
        print(
            f"\n── {runner.lines_differing(recorded, printed)} between your tree's prints "
            f"and {prints} ──"
        )
        sys.stdout.write(
            runner.prints_diff(recorded, printed, prints, ("recorded", "printed by your tree"))
        )
    return False


def _learner_tree(book: Book, folder: Path) -> Path:
    """A learner's tree must have the checkout's layout and import."""
    folder = folder.resolve()
    top = next(iter(book.history), "minisgl/").split("/")[0]
    package = folder / "python" / top
    if not package.is_dir():
        raise BookError(
            f"no python/{top} here: a learner's tree has a checkout's layout (DIR/python/{top})",
            str(folder),
        )
    done = subprocess.run(
        [sys.executable, "-c", f"import {top}"],
        capture_output=True,
        text=True,
        env=runner.fixed_env(folder / "python"),
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise BookError(f"the package does not import: {last}", str(package))
    return folder


def cmd_check(book: Book, args: argparse.Namespace) -> int:
    chapters = parse_selection(book, args.chapters)
    against = _learner_tree(book, args.against) if args.against else None
    options = check.Options(
        static=args.static,
        cumulative=args.cumulative,
        use_cache=not args.no_cache,
        against=against,
        no_skip=args.no_skip,
        tool=_invocation(book),
    )
    packages = installed.snapshot()
    results = check.check_book(book, chapters, options, args.jobs, sys.stderr)
    print(check.summary_table(results), end="")
    failed = any(r.status == "fail" for r in results)
    changed = installed.note(packages, installed.snapshot()) if failed else ""
    if changed:  # before the details: it may explain them
        print(f"\nnote: {changed}")
    _print_forwards(results)
    if against is not None:
        _print_learner_report(results)
    for r in results:
        for heading, detail in r.details:
            print(f"\n── {r.chapter.name} · {heading} ──\n{detail.rstrip()}")
    if args.junit:
        check.write_junit(results, args.junit.resolve())
    return 1 if failed else 0


def _print_forwards(results: list[check.Result]) -> None:
    seen = sorted({(f.where, f.module, f.chapter) for r in results for f in r.forwards})
    if seen:
        print("forward references (allowed until their chapter):")
        for where, module, number in seen:
            print(f"  {where}: {module} (ch{number:02d})")


def _invocation(book: Book) -> str:
    """How to run this tool again from here, for the commands a report shows."""
    script = Path(__file__).resolve().parents[1] / "steps.py"
    try:
        shown = script.relative_to(Path.cwd())
    except ValueError:
        shown = script
    root = "" if book.root == DEFAULT_ROOT else f" --root {shlex.quote(str(book.root))}"
    return f"{check.python_command()} {shlex.quote(str(shown))}{root}"


def _print_learner_report(results: list[check.Result]) -> None:
    print("\nyour tree, item by item:")
    for r in results:
        print(f"  {r.chapter.id} main: {r.steps.get('main', r.reason or '-')}")
        for test, outcome, why in r.tests:
            print(f"  {r.chapter.id} {outcome:7} {test}" + (f"  ({why})" if why else ""))


def cmd_record(book: Book, args: argparse.Namespace) -> int:
    chapters = [c for text in args.chapters for c in parse_selection(book, text)]
    status = 0
    for chapter in chapters:
        with tempfile.TemporaryDirectory(prefix=f"steps-{chapter.id}-") as scratch:
            tree = Path(scratch)
            write_tree(tree_at(book, chapter), tree)
            outcome = runner.run_main(
                tree, chapter.main, tree / "python", chapter.requires == "gpu"
            )
        if not outcome.ok:
            print(f"{chapter.id}: not recorded: {outcome.detail}")
            status = 1
            continue
        path = book.root / chapter.folder / PRINTS
        old = path.read_text(encoding="utf-8") if path.is_file() else ""
        if old == outcome.output:
            print(f"{chapter.id}: {chapter.folder}/{PRINTS} unchanged")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(PRINTS + ".part")
        partial.write_text(outcome.output, encoding="utf-8")
        partial.replace(path)
        print(f"{chapter.id}: recorded {chapter.folder}/{PRINTS}")
        sys.stdout.write(runner.prints_diff(old, outcome.output, f"{chapter.folder}/{PRINTS}"))
    return status


def cmd_matrix(book: Book, args: argparse.Namespace) -> int:
    chapters = book.chapters
    if args.changed_since:
        changed = _changed_files(book, args.changed_since)
        chapters = [c for c in chapters if _affected(book, c, changed)]
    entries = [
        {"chapter": c.id, "name": c.name, "title": c.title, "requires": c.requires}
        for c in chapters
    ]
    print(json.dumps({"include": entries}))
    return 0


def _changed_files(book: Book, ref: str) -> set[str]:
    commands = [
        ["git", "diff", "--name-only", ref, "--"],
        ["git", "ls-files", "--others", "--exclude-standard"],
    ]
    changed: set[str] = set()
    for command in commands:
        done = subprocess.run(command, cwd=book.root, capture_output=True, text=True)
        if done.returncode != 0:
            raise BookError(f"git could not compare with {ref!r}: {done.stderr.strip()}")
        changed |= set(done.stdout.split())
    return changed


def _affected(book: Book, chapter: Chapter, changed: set[str]) -> bool:
    if any(path.startswith(GLOBAL_INPUTS) for path in changed):
        return True
    sources = tree_at(book, chapter).values()
    inputs = {source.relative_to(book.root).as_posix() for source in sources}
    return bool(changed & inputs) or any(p.startswith(chapter.folder + "/") for p in changed)


def cmd_render(book: Book, args: argparse.Namespace) -> int:
    out = (args.out or book.root / "build" / "book").resolve()
    written = render_book(book, out)
    print(f"wrote {len(written)} pages to {out}")
    return 0


COMMANDS = {
    "list": cmd_list,
    "tree": cmd_tree,
    "checkout": cmd_checkout,
    "import": cmd_import,
    "diff": cmd_diff,
    "run": cmd_run,
    "check": cmd_check,
    "record": cmd_record,
    "matrix": cmd_matrix,
    "render": cmd_render,
}
