"""Shared pytest setup: the tree's own package first on sys.path, and the tiny models fixture."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator, Mapping

# Without a GPU, Triton kernels run in Triton's interpreter, which must be chosen before any test
# module imports triton (conftest is imported first).
if not Path("/dev/nvidia0").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))  # tiny_models.py, as the mains import it
sys.path.insert(0, str(ROOT / "python"))  # test this tree's minisgl, not another one


class _TinyModels(Mapping[str, Path]):
    """name -> model directory; each model is made the first time a test asks for it."""

    def __init__(self, directory: Path):
        import tiny_models

        self._make = tiny_models.make_tiny_model
        self._names = tiny_models.FAMILIES
        self._directory = directory
        self._made: dict[str, Path] = {}

    def __getitem__(self, name: str) -> Path:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._made:
            self._made[name] = self._make(name, self._directory / name)
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Mapping[str, Path]:
    """The tiny random-weight models of examples/tiny_models.py, made once per test session."""
    return _TinyModels(tmp_path_factory.mktemp("tiny_models"))
