from __future__ import annotations

from dataclasses import dataclass


def div_even(a: int, b: int) -> int:
    """``a // b`` when ``b`` divides ``a`` (heads over ranks, say); otherwise a ValueError."""
    if b <= 0 or a % b != 0:
        raise ValueError(f"{a} is not evenly divisible by {b}")
    return a // b


def div_ceil(a: int, b: int) -> int:
    """The smallest ``n`` with ``n * b >= a``."""
    return (a + b - 1) // b


@dataclass(frozen=True)
class TPInfo:
    """This process's place among the tensor-parallel ranks that share each weight."""

    rank: int
    size: int


def get_tp_info() -> TPInfo:
    """The rank information of a single process: one rank holding every weight whole."""
    return TPInfo(rank=0, size=1)
