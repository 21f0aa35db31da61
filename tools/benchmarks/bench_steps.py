"""How fast is the steps tool where a maintainer feels it? A benchmark, not a test.

    python tools/benchmarks/bench_steps.py [--root BOOK]

Prints, for the book: `check --static` over every chapter; a warm `check` with nothing changed
(every chapter served from the cache); and, after touching the newest version of one package
file (its bytes changed and restored), which chapters `check` re-runs and how long that takes.
Run it after one full `check` so the cache is warm.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

STEPS = Path(__file__).resolve().parents[1] / "steps.py"


def timed(root: Path, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(STEPS), "--root", str(root), *args], capture_output=True, text=True
    )
    return time.perf_counter() - start, done


def best_of(n: int, root: Path, *args: str) -> float:
    return min(timed(root, *args)[0] for _ in range(n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=STEPS.parents[1])
    parser.add_argument(
        "--file", default="python/minisgl/layers/norm.py", help="the file whose edit is simulated"
    )
    args = parser.parse_args()
    root = args.root.resolve()

    print(f"check --static, every chapter:      {best_of(3, root, 'check', '--static'):.2f} s")
    print(f"warm check, nothing changed:        {best_of(3, root, 'check'):.2f} s")

    path = root / args.file
    original = path.read_bytes()
    try:
        path.write_bytes(original + b"\n# an edit\n")
        seconds, done = timed(root, "check")
    finally:
        path.write_bytes(original)
    rows = [
        line.split()[0]
        for line in done.stdout.splitlines()[2:]
        if line.startswith("ch") and "(cached)" not in line
    ]
    print(f"check after editing {args.file}: {seconds:.2f} s, re-ran {', '.join(rows) or 'none'}")


if __name__ == "__main__":
    main()
