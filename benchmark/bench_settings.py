"""One chapter's tree under several settings, side by side (chapters 18, 19, 21 and 22).

    python benchmark/bench_settings.py --chapter 18 --setting "off:--overlap off" \\
        --setting "on:--overlap on" -- --shape qwen3-0.6b
    python benchmark/bench_settings.py --chapter 21 --setting "fused:--moe-backend fused" \\
        --setting "sync_free:--moe-backend sync_free" -- --shape qwen3-30b-a3b
    python benchmark/bench_settings.py --chapter 22 --setting "kernels on:" \\
        --setting "kernels off:MINISGL_DISABLE_FUSED_KERNELS=1" -- --shape qwen3-0.6b --breakdown

Writes the chapter's tree (``tools/steps.py checkout``) into a temporary folder with this
folder's ``offline.py`` beside it, so that the engine measured is that chapter's code and
nothing later. A setting is ``LABEL:WORDS``: the words that look like ``NAME=VALUE`` with an
upper-case name go into the environment of its runs, the others are options added to
``offline.py``'s (the ones after ``--``, shared by every setting). Every run is ``offline.py`` in
a process of its own, all of them sharing one fresh Triton cache (``TRITON_CACHE_DIR``): first
one run of each setting whose figures are dropped, so that every kernel the workload needs is
compiled before a timed run (the first run of a shape on a machine compiles inside its timed
``generate``); then ``--runs`` rounds, the settings taking turns, in reverse order every other
round, so that a drift of the machine touches all alike. The environment variables the book
reads (``MINISGL_*``) are cleared first: a run gets only those its setting names.

It prints each run's output tokens/s, then each setting's runs, median and spread ((highest -
lowest) / median) and the ratio of its median to the first setting's, as a Markdown table. With
``--breakdown`` among ``offline.py``'s options it also tables each phase's ms a call (the
median of the runs, and their spread). ``--json PATH`` writes the runs too. On a CPU
(``--shape tiny --device cpu --num-seqs 4 --max-output 8``) it checks the script; its figures
there say nothing of a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Sequence

ROOT = Path(__file__).resolve().parents[1]
# offline.py's line for its timed generate; the rate is recomputed from the tokens and seconds
RESULT = re.compile(r"^minisgl\s+[\d,]+ output tokens/s\s+\(([\d,]+) tokens in ([\d.]+) s\)$")
# a row of offline.py --breakdown's table: phase, seconds, calls, ms a call, share
PHASE = re.compile(r"^(\S.*?)\s+([\d.]+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)%$")
ENV_WORD = re.compile(r"^[A-Z][A-Z0-9_]*=")


@dataclass
class Setting:
    label: str
    env: Dict[str, str] = field(default_factory=dict)
    options: List[str] = field(default_factory=list)


@dataclass
class Run:
    tokens_per_s: float
    phases_ms: Dict[str, float]  # ms a call of each --breakdown phase; empty without it


def parse_setting(spec: str) -> Setting:
    """``"off:MINISGL_DISABLE_FUSED_KERNELS=1 --page-size 16"`` -> the label, its environment
    and its options."""
    label, colon, rest = spec.partition(":")
    if not colon or not label.strip():
        raise ValueError(f"a setting is LABEL:WORDS, got {spec!r}")
    setting = Setting(label.strip())
    for word in shlex.split(rest):
        if ENV_WORD.match(word):
            name, _, value = word.partition("=")
            setting.env[name] = value
        else:
            setting.options.append(word)
    return setting


def parse_output(stdout: str) -> Run:
    """The timed run's output tokens/s and, where printed, the breakdown's ms a call."""
    found = [m for line in stdout.splitlines() if (m := RESULT.match(line.strip()))]
    if len(found) != 1:
        raise ValueError("offline.py printed no single 'minisgl ... output tokens/s' line")
    tokens, seconds = int(found[0][1].replace(",", "")), float(found[0][2])
    phases = {}
    for line in stdout.splitlines():
        if (m := PHASE.match(line.strip())) is not None:
            phases[m[1]] = float(m[4])
    return Run(tokens / seconds, phases)


def write_tree(chapter: int, directory: Path) -> Path:
    """The chapter's tree with offline.py in its benchmark/ folder: offline.py puts its own
    tree's python/ and examples/ first on sys.path."""
    steps = ROOT / "tools" / "steps.py"
    subprocess.run(
        [sys.executable, str(steps), "checkout", str(chapter), str(directory)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (directory / "benchmark").mkdir(exist_ok=True)
    shutil.copy(ROOT / "benchmark" / "offline.py", directory / "benchmark" / "offline.py")
    return directory / "benchmark" / "offline.py"


def run_once(script: Path, options: List[str], setting: Setting, triton_cache: Path) -> Run:
    """One offline.py process under ``setting``. Its output goes on to this one's stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINISGL_")}
    env.update(setting.env, TRITON_CACHE_DIR=str(triton_cache))
    command = [sys.executable, str(script), *options, *setting.options]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    sys.stderr.write(done.stdout + done.stderr)
    if done.returncode != 0:
        sys.exit(f"{setting.label}: {shlex.join(command)} failed with status {done.returncode}")
    return parse_output(done.stdout)


def _spread(figures: Sequence[float]) -> float:
    return (max(figures) - min(figures)) / statistics.median(figures)


def table(
    chapter: int, options: List[str], settings: List[Setting], runs: Dict[str, List[Run]]
) -> str:
    """The runs as Markdown: output tokens/s per setting, then each phase's ms a call."""
    lines = [
        f"chapter {chapter}'s tree, offline.py {shlex.join(options)}, one warmed Triton cache:",
        "",
        "| setting | output tokens/s, runs in order | median | spread | vs the first |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    first = statistics.median(r.tokens_per_s for r in runs[settings[0].label])
    for s in settings:
        figures = [r.tokens_per_s for r in runs[s.label]]
        median = statistics.median(figures)
        each = "; ".join(f"{f:,.0f}" for f in figures)
        lines.append(
            f"| {s.label} | {each} | {median:,.0f} | {100 * _spread(figures):.1f}% | "
            f"{median / first:.3f} |"
        )
    phases = [p for p in runs[settings[0].label][0].phases_ms]
    if phases:
        lines += [
            "",
            "ms a call of each --breakdown phase, the median of the runs (their spread):",
            "",
            "| phase | " + " | ".join(s.label for s in settings) + " |",
            "| --- |" + " ---: |" * len(settings),
        ]
        for phase in phases:
            cells = []
            for s in settings:
                figures = [r.phases_ms[phase] for r in runs[s.label] if phase in r.phases_ms]
                if not figures:
                    cells.append("-")
                    continue
                median = statistics.median(figures)
                cells.append(f"{median:.3f} ({100 * _spread(figures):.0f}%)")
            lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chapter", type=int, required=True, help="whose tree (15 or later)")
    parser.add_argument("--setting", action="append", required=True, metavar="LABEL:WORDS")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each setting")
    parser.add_argument("--json", type=Path, default=None, help="also write the runs here")
    args = parser.parse_args(argv[:cut])
    options = argv[cut + 1 :]
    if args.chapter < 15:
        parser.error("benchmark/offline.py needs chapter 15's tree or a later one")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    try:
        settings = [parse_setting(spec) for spec in args.setting]
    except ValueError as e:
        parser.error(str(e))
    if len({s.label for s in settings}) != len(settings):
        parser.error("two settings share a label")
    runs: Dict[str, List[Run]] = {s.label: [] for s in settings}
    with tempfile.TemporaryDirectory() as tmp:
        script = write_tree(args.chapter, Path(tmp) / "tree")
        cache = Path(tmp) / "triton"
        for s in settings:  # dropped: they fill the Triton cache
            warm = run_once(script, options, s, cache)
            print(f"warm-up, {s.label}: {warm.tokens_per_s:,.0f}", flush=True)
        for i in range(args.runs):
            for s in settings if i % 2 == 0 else settings[::-1]:
                runs[s.label].append(run_once(script, options, s, cache))
                print(f"run {i + 1}, {s.label}: {runs[s.label][-1].tokens_per_s:,.0f}", flush=True)
    print()
    print(table(args.chapter, options, settings, runs))
    if args.json is not None:
        record = {
            "chapter": args.chapter,
            "options": options,
            "settings": {s.label: {"env": s.env, "options": s.options} for s in settings},
            "runs": {k: [vars(r) for r in v] for k, v in runs.items()},
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
