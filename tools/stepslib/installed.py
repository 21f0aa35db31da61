"""The packages installed where this Python imports from, to notice one that changes mid-check.

A package installed while `check` runs (an extra, say) can make a test fail that passed a
moment before, or pass one that failed: the report then says which package changed, so that the
reader re-runs instead of hunting a bug. Each installed distribution has a metadata folder,
`name-version.dist-info`, in a site-packages folder on `sys.path`; installing, upgrading or
removing a package adds, renames or removes that folder, and reinstalling rewrites it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

Snapshot = dict[str, int]  # a metadata folder's path -> its modification time (ns)
METADATA = re.compile(r"^(?P<name>.+?)-(?P<version>[^-]+)\.dist-info$")


def site_folders() -> list[Path]:
    """The site-packages folders this Python imports from (the tests' Python is this one)."""
    return [Path(p) for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]


def snapshot(folders: list[Path] | None = None) -> Snapshot:
    found: Snapshot = {}
    for folder in site_folders() if folders is None else folders:
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            if METADATA.match(entry.name):
                try:
                    found[str(entry)] = entry.stat().st_mtime_ns
                except OSError:  # removed between the listing and the look
                    continue
    return found


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """What happened to each package between two snapshots: `accelerate 1.2.1 was installed`,
    `torch 2.5.0 was replaced by 2.5.1`, `numpy 2.1.0 was reinstalled`, `x 1.0 was removed`."""
    old, new = _versions(before), _versions(after)
    told = []
    for name, site in sorted(old.keys() | new.keys()):
        was, now = old.get((name, site)), new.get((name, site))
        if was is None:
            told.append(f"{name} {now[0]} was installed")
        elif now is None:
            told.append(f"{name} {was[0]} was removed")
        elif was[0] != now[0]:
            told.append(f"{name} {was[0]} was replaced by {now[0]}")
        elif was[1] != now[1]:
            told.append(f"{name} {now[0]} was reinstalled")
    return told


def _versions(found: Snapshot) -> dict[tuple[str, str], tuple[str, int]]:
    """(a package's name as pip normalises it, its site folder) -> its version and its metadata
    folder's time. A package may be in two site folders (a virtualenv's and the user's)."""
    versions = {}
    for path, mtime in found.items():
        parts = METADATA.match(Path(path).name)
        name = re.sub(r"[-_.]+", "-", parts["name"]).lower()
        versions[(name, str(Path(path).parent))] = (parts["version"], mtime)
    return versions


def note(before: Snapshot, after: Snapshot) -> str:
    """A paragraph for the report, or "" when nothing changed."""
    told = changes(before, after)
    if not told:
        return ""
    return (
        f"while check ran, {'; '.join(told)}.\n"
        "A failure may come from that change, not from the book: re-run check."
    )
