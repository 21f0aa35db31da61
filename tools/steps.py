#!/usr/bin/env python3
"""Rebuild, run and check the book chapter by chapter: `python tools/steps.py --help`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stepslib.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
