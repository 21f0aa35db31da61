import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bookmaker import toy_book  # noqa: E402


@pytest.fixture
def book(tmp_path: Path) -> Path:
    return toy_book(tmp_path / "book")


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root and its bytes, to show that a command wrote nothing."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def unchanged():
    """Assert that a block leaves a folder exactly as it was."""

    class Guard:
        def __init__(self, root: Path):
            self.root, self.before = root, snapshot(root)

        def check(self) -> None:
            assert snapshot(self.root) == self.before

    return Guard
