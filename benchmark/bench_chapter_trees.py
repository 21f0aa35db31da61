"""Offline throughput of several chapters' own trees, side by side (chapters 15 to 17).

    python benchmark/bench_chapter_trees.py 16 17 [--rounds 3] -- --shape qwen3-0.6b
    python benchmark/bench_chapter_trees.py 15 16 -- --shape qwen3-0.6b --num-seqs 32 \\
        --max-output 128
    python benchmark/bench_chapter_trees.py 17 --extra "17:--cuda-graph-max-bs 0" -- --shape ...

Each chapter's tree is written by ``tools/steps.py checkout N`` (the package as that chapter
leaves it, nothing of a later one), and ``benchmark/offline.py`` (chapter 15's method: nano-vllm's
workload, a warm-up ``generate``, then the timed one) runs in it, in a fresh process, with the
options after ``--``. The chapters take turns, round after round, so that whatever drifts on the
machine (its clocks, its other jobs, a warm cache) falls on every chapter alike; the figure of a
chapter is the median of its rounds. ``--extra N:OPTIONS`` adds options for one chapter only
(``17:--cuda-graph-max-bs 0``: chapter 17's tree with its graphs off). ``--warm-rounds`` (1 by
default) runs every chapter that many times first, untimed: Triton compiles a kernel the first
time a shape meets it and caches it on disk, and a timed run should not pay for that.

Prints one line per run as it ends, then a table: each chapter's runs, their median, and the
median's ratio to the first chapter's. ``--json PATH`` writes the same as a record.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
RESULT = re.compile(
    r"^minisgl\s+([\d,]+) output tokens/s\s+\(([\d,]+) tokens in ([\d.]+) s\)", re.M
)


def parse_args() -> argparse.Namespace:
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("chapters", type=int, nargs="+", help="chapter numbers, 15 or later")
    p.add_argument("--rounds", type=int, default=3, help="runs of each chapter, taken in turn")
    p.add_argument("--warm-rounds", type=int, default=1, help="untimed rounds first")
    p.add_argument("--extra", action="append", default=[], metavar="N:OPTIONS")
    p.add_argument("--json", type=Path, help="write the runs and medians here")
    p.add_argument("--keep", type=Path, help="write the trees here and keep them")
    args = p.parse_args(argv[:cut])
    args.offline = argv[cut + 1 :]
    if min(args.chapters) < 15:
        p.error("benchmark/offline.py needs chapter 15's tree or a later one")
    return args


def extra_options(specs: List[str]) -> Dict[int, List[str]]:
    """``["17:--cuda-graph-max-bs 0"]`` -> ``{17: ["--cuda-graph-max-bs", "0"]}``."""
    options: Dict[int, List[str]] = {}
    for spec in specs:
        chapter, _, rest = spec.partition(":")
        options.setdefault(int(chapter), []).extend(shlex.split(rest))
    return options


def write_tree(chapter: int, where: Path) -> Path:
    """Chapter ``chapter``'s tree under ``where``, with this repository's benchmark/offline.py."""
    tree = where / f"ch{chapter:02d}"
    if tree.exists():
        shutil.rmtree(tree)
    steps = [sys.executable, str(ROOT / "tools/steps.py"), "checkout", str(chapter), str(tree)]
    subprocess.run(steps, check=True, stdout=subprocess.DEVNULL)
    (tree / "benchmark").mkdir(exist_ok=True)
    shutil.copy(ROOT / "benchmark/offline.py", tree / "benchmark/offline.py")
    return tree


def run_once(tree: Path, options: List[str]) -> Dict[str, float]:
    """One offline.py run in ``tree``: its output tokens/s and seconds."""
    command = [sys.executable, str(tree / "benchmark/offline.py"), *options]
    done = subprocess.run(command, cwd=tree, capture_output=True, text=True)
    found = RESULT.search(done.stdout)
    if done.returncode != 0 or found is None:
        sys.exit(f"{shlex.join(command)} failed:\n{done.stdout}\n{done.stderr}")
    rate, tokens, seconds = found.groups()
    return {
        "tokens_per_s": float(rate.replace(",", "")),
        "tokens": int(tokens.replace(",", "")),
        "seconds": float(seconds),
    }


def main() -> None:
    args = parse_args()
    extra = extra_options(args.extra)
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        trees = {n: write_tree(n, where) for n in args.chapters}
        runs: Dict[int, List[Dict[str, float]]] = {n: [] for n in args.chapters}
        for round_ in range(1 - args.warm_rounds, args.rounds + 1):
            for n in args.chapters:
                run = run_once(trees[n], args.offline + extra.get(n, []))
                kept = round_ >= 1
                if kept:
                    runs[n].append(run)
                print(
                    f"{'round ' + str(round_) if kept else 'warm-up'}, chapter {n}: "
                    f"{run['tokens_per_s']:,.0f} output tokens/s ({run['tokens']:,} tokens in "
                    f"{run['seconds']:.2f} s)",
                    flush=True,
                )
    medians = {n: statistics.median(r["tokens_per_s"] for r in runs[n]) for n in args.chapters}
    first = medians[args.chapters[0]]
    print(f"\nbenchmark/offline.py {shlex.join(args.offline)}, each chapter's own tree:")
    print(
        f"| chapter | options | runs (output tokens/s) | median | vs chapter {args.chapters[0]} |"
    )
    print("|---|---|---|---|---|")
    for n in args.chapters:
        rates = ", ".join(f"{r['tokens_per_s']:,.0f}" for r in runs[n])
        print(
            f"| {n} | {shlex.join(extra.get(n, [])) or '-'} | {rates} | {medians[n]:,.0f} | "
            f"{medians[n] / first:.2f}x |"
        )
    if args.json:
        record = {
            "command": f"python benchmark/bench_chapter_trees.py {shlex.join(sys.argv[1:])}",
            "chapters": {
                str(n): {"options": extra.get(n, []), "runs": runs[n], "median": medians[n]}
                for n in args.chapters
            },
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
