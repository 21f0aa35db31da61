"""A failed test run made short for a reader: the first failure whole, the rest cut and marked.

pytest prints a section per failure (`____ test_name ____` under `==== FAILURES ====`, errors
under `==== ERRORS ====`), then `==== short test summary info ====` and the counts. The first
failure is the one that points at the bug, so it is kept whole, and so is the summary; what lies
around them is cut at line boundaries, and each cut says how much it took.

The frames of a traceback that lie in libraries (site-packages, the standard library, pytest's
own) are folded into one line per run of them: the bug is in the book's code or the test, and a
library's frame can print a whole function's source, docstring and all, before the `E` line.
"""

from __future__ import annotations

import re

BEFORE_LIMIT = 2000  # characters of the progress lines (and sections printed before the first)
REST_LIMIT = 6000  # characters of the other failures
CAPTURED_LIMIT = 3000  # characters of each output the first failure captured
SUMMARY_LIMIT = 10000  # characters of the short summary: a line per failure
RULE = re.compile(r"^=+ (.+?) =+$")
TEST_RULE = re.compile(r"^_{3,} (.+?) _{3,}$")
CAPTURED_RULE = re.compile(r"^-{3,} Captured .+ -{3,}$")
BLOCKS = {"FAILURES", "ERRORS"}  # the rules under which pytest prints one section per failure
SUMMARY = "short test summary info"
# pytest's own rules after the failures; a test's captured output may print rules of its own
ENDS = BLOCKS | {SUMMARY, "warnings summary", "PASSES"}
COUNTS = re.compile(r"^\d+ (failed|passed|error|errors|skipped)\b")
# A frame's first line: pytest's `--tb=short` (`path:12: in name`) or Python's own traceback
PYTEST_FRAME = re.compile(r"^(?P<indent>)(?P<path>[^\s:][^:]*):(?P<line>\d+): in (?P<name>\S.*)$")
PYTHON_FRAME = re.compile(
    r'^(?P<indent> +)File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<name>.+)$'
)
SITE = re.compile(r"[/\\](?:site|dist)-packages[/\\](?P<package>[^/\\]+)")
STDLIB = re.compile(r"[/\\]lib[/\\]python3\.\d+[/\\](?P<package>[^/\\]+)")
FROZEN = re.compile(r"^<frozen (?P<package>[\w.]+)>")


def cut(text: str, limit: int) -> str:
    """`text`, or as many of its first and last lines as fit in `limit`, the cut marked."""
    if len(text) <= limit:
        return text
    lines = text.splitlines(keepends=True)
    head, tail, kept = 0, len(lines), 0
    while head < tail and kept + len(lines[head]) <= limit // 2:
        kept += len(lines[head])
        head += 1
    while tail > head and kept + len(lines[tail - 1]) <= limit:
        kept += len(lines[tail - 1])
        tail -= 1
    marker = f"... {len(text) - kept:,} characters cut ...\n"
    return "".join(lines[:head]) + marker + "".join(lines[tail:])


def failure_report(output: str, failed: list[str]) -> tuple[str, str | None]:
    """The output made short, and the node id of the failure it shows whole.

    `failed` holds the failing node ids in the order they ran; the first of them that has a
    section is shown whole, its library frames folded. Without any section (pytest crashed,
    say) the output is only cut.
    """
    lines = fold_library_frames(output).splitlines(keepends=True)
    sections = _sections(lines)
    if not sections:
        return cut("".join(lines), BEFORE_LIMIT + REST_LIMIT), None
    node, (start, end) = _first(sections, failed)
    summary = _summary_start(lines, end)
    parts = [
        cut("".join(lines[:start]), BEFORE_LIMIT),
        _whole(lines[start:end]),
        cut("".join(lines[end:summary]), REST_LIMIT),
        cut("".join(lines[summary:]), SUMMARY_LIMIT),
    ]
    return "".join(parts), node


def _sections(lines: list[str]) -> dict[str, tuple[int, int]]:
    """Each failure's header (`test_x[1]`, `ERROR at setup of test_y`) -> its lines' range."""
    sections: dict[str, tuple[int, int]] = {}
    block, header, start = False, "", 0
    for i, line in enumerate([*lines, "=== PASSES ===\n"]):  # a rule ends the last section
        rule, test = _rule(line), TEST_RULE.match(line.rstrip("\n"))
        if header and (rule or (block and test)):
            sections.setdefault(header, (start, i))
            header = ""
        if rule:
            block = rule.group(1) in BLOCKS
        elif block and test:
            header, start = test.group(1), i
    return sections


def _rule(line: str) -> re.Match | None:
    """One of pytest's own rules, `==== FAILURES ====`, not one a test printed."""
    rule = RULE.match(line.rstrip("\n"))
    return rule if rule and (rule.group(1) in ENDS or COUNTS.match(rule.group(1))) else None


def _first(
    sections: dict[str, tuple[int, int]], failed: list[str]
) -> tuple[str | None, tuple[int, int]]:
    for node in failed:
        for header in _headers(node):
            if header in sections:
                return node, sections[header]
    return None, min(sections.values())


def _headers(node: str) -> list[str]:
    """The section headers pytest gives a node id's failures."""
    path, _, name = node.partition("::")
    if not name:  # a module that failed to import
        return [f"ERROR collecting {path}"]
    name = name.replace("::", ".")
    return [name, f"ERROR at setup of {name}", f"ERROR at teardown of {name}"]


def _summary_start(lines: list[str], after: int) -> int:
    for i in range(after, len(lines)):
        rule = _rule(lines[i])
        if rule and rule.group(1) == SUMMARY:
            return i
    return len(lines)


def _whole(section: list[str]) -> str:
    """A failure's section: its traceback whole, each output it captured cut to a limit."""
    parts, current = [], []
    for line in section:
        if CAPTURED_RULE.match(line.rstrip("\n")):
            parts.append(current)
            current = [line]
        else:
            current.append(line)
    parts.append(current)
    traceback, *captured = parts
    return "".join(traceback) + "".join(
        part[0] + cut("".join(part[1:]), CAPTURED_LIMIT) for part in captured
    )


# --- library frames, folded -------------------------------------------------------------------


def fold_library_frames(text: str) -> str:
    """`text` with each run of a traceback's library frames folded into one line that names the
    libraries and the last frame: `... 3 frames in transformers folded, the last
    transformers/modeling_utils.py:4012 in from_pretrained`."""
    lines = text.splitlines(keepends=True)
    kept: list[str] = []
    run: list[tuple[str, str]] = []  # the folded frames so far: (library, where)
    indent, i = "", 0
    while i < len(lines):
        frame = PYTEST_FRAME.match(lines[i].rstrip("\n")) or PYTHON_FRAME.match(lines[i])
        if frame is None:
            kept += _folded(run, indent) + [lines[i]]
            run, i = [], i + 1
            continue
        end = _frame_end(lines, i + 1, len(frame["indent"]))
        found = library(frame["path"])
        if found is None:
            kept += _folded(run, indent) + lines[i:end]
            run = []
        else:
            name, shown = found
            run.append((name, f"{shown}:{frame['line']} in {frame['name'].rstrip()}"))
            indent = frame["indent"]
        i = end
    return "".join(kept + _folded(run, indent))


def library(path: str) -> tuple[str, str] | None:
    """The library a frame's file belongs to and the path from its folder on, or None for a
    file of the book's own (the tree's, a learner's)."""
    found = SITE.search(path) or STDLIB.search(path) or FROZEN.search(path)
    if found is None:
        return None
    return found["package"].removesuffix(".py"), path[found.start("package") :].rstrip(">")


def _frame_end(lines: list[str], start: int, indent: int) -> int:
    """Where a frame's lines end: its source lines are indented deeper than its first line."""
    end = start
    while end < len(lines) and _indent(lines[end]) > indent and lines[end].strip():
        end += 1
    return end


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _folded(run: list[tuple[str, str]], indent: str) -> list[str]:
    if not run:
        return []
    names = ", ".join(dict.fromkeys(name for name, _ in run))
    frames = "1 frame" if len(run) == 1 else f"{len(run)} frames"
    return [f"{indent}... {frames} in {names} folded, the last {run[-1][1]}\n"]
