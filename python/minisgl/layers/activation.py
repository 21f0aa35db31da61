from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation on a merged gate-up output: ``silu(gate) * up``.

    x: [T, 2 * I], the gate half first, then the up half -> [T, I]
    """
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
