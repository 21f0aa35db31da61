"""Overlap scheduling off and on, side by side, on one chapter's tree (chapter 18).

    python benchmark/bench_overlap.py [--chapter 18] [--runs 3] [--json OUT] \\
        --shape qwen3-0.6b [offline.py's other options]

Writes the tree of the chapter (``tools/steps.py checkout``) into a temporary directory, with
this folder's ``offline.py`` beside it, so that the engine measured is that chapter's code and
nothing later. Every run is ``offline.py`` in a process of its own, all of them sharing one
fresh Triton cache (``TRITON_CACHE_DIR``): first one run with overlap off and one with it on,
whose figures are dropped, so that every kernel variant the workload needs is compiled before a
timed run; then ``--runs`` runs of each, off and on taking turns, so that a drift of the
machine touches both alike. It prints each run's output tokens/s, each setting's median and
spread ((highest - lowest) / median), and on / off of the medians. The options it does not know
go to ``offline.py`` as they are (``--shape``, ``--num-seqs``, ``--device`` ...); ``--overlap``
is its own. On a CPU (``--device cpu --shape tiny --num-seqs 4 --max-output 8``) it checks the
script, not the overlap: the forward runs as it is called, so there is nothing to hide.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ("off", "on")
# offline.py's line for the timed generate: "minisgl   15,506 output tokens/s  (133,966 tokens
# in 8.64 s)"; the rate is recomputed from the tokens and seconds, which it rounds less
RESULT = re.compile(r"^minisgl\s+[\d,]+ output tokens/s\s+\(([\d,]+) tokens in ([\d.]+) s\)$")


def write_tree(chapter: int, directory: Path) -> Path:
    """The chapter's tree with offline.py in its benchmark/ folder: offline.py puts its own
    tree's python/ and examples/ first on sys.path."""
    steps = ROOT / "tools" / "steps.py"
    subprocess.run(
        [sys.executable, str(steps), "checkout", str(chapter), str(directory)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (directory / "benchmark").mkdir()
    shutil.copy(ROOT / "benchmark" / "offline.py", directory / "benchmark" / "offline.py")
    return directory / "benchmark" / "offline.py"


def run_once(script: Path, options: List[str], overlap: str, triton_cache: Path) -> float:
    """One offline.py process; its output tokens/s. Its output goes on to this one's stderr."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(triton_cache)}
    env.pop("MINISGL_DISABLE_OVERLAP_SCHEDULING", None)  # it would override --overlap on
    done = subprocess.run(
        [sys.executable, str(script), *options, "--overlap", overlap],
        env=env,
        capture_output=True,
        text=True,
    )
    sys.stderr.write(done.stdout + done.stderr)
    if done.returncode != 0:
        sys.exit(f"offline.py --overlap {overlap} failed with status {done.returncode}")
    found = [m for line in done.stdout.splitlines() if (m := RESULT.match(line.strip()))]
    if len(found) != 1:
        sys.exit("offline.py printed no 'minisgl ... output tokens/s' line")
    tokens, seconds = int(found[0][1].replace(",", "")), float(found[0][2])
    return tokens / seconds


def table(chapter: int, options: List[str], runs: Dict[str, List[float]]) -> str:
    """The runs as a Markdown table, with the ratio of the medians under it."""
    lines = [
        f"chapter {chapter}'s tree, offline.py {' '.join(options)}, one warmed Triton cache:",
        "",
        "| overlap | output tokens/s, runs in order | median | spread |",
        "| --- | --- | ---: | ---: |",
    ]
    medians = {}
    for setting in SETTINGS:
        figures = runs[setting]
        medians[setting] = median = statistics.median(figures)
        spread = (max(figures) - min(figures)) / median
        each = "; ".join(f"{f:,.0f}" for f in figures)
        lines.append(f"| {setting} | {each} | {median:,.0f} | {100 * spread:.1f}% |")
    lines += ["", f"on / off, medians: {medians['on'] / medians['off']:.3f}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chapter", type=int, default=18, help="whose tree (18 or later)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each setting")
    parser.add_argument("--json", type=Path, default=None, help="also write the runs here")
    args, options = parser.parse_known_args()
    if args.chapter < 18:
        parser.error("overlap scheduling arrives in chapter 18")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if "--overlap" in options:
        parser.error("--overlap is this script's to set, run by run")
    runs: Dict[str, List[float]] = {setting: [] for setting in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        script = write_tree(args.chapter, Path(tmp) / "tree")
        cache = Path(tmp) / "triton"
        for setting in SETTINGS:  # dropped: they fill the Triton cache
            print(f"warm-up, overlap {setting}: {run_once(script, options, setting, cache):,.0f}")
        for i in range(args.runs):
            for setting in SETTINGS if i % 2 == 0 else SETTINGS[::-1]:
                runs[setting].append(run_once(script, options, setting, cache))
                print(f"run {i + 1}, overlap {setting}: {runs[setting][-1]:,.0f}", flush=True)
    print()
    print(table(args.chapter, options, runs))
    if args.json is not None:
        record = {"chapter": args.chapter, "options": options, "runs": runs}
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
