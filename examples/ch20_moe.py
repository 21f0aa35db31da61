"""Chapter 20: MoE routing, sorting and padding by expert, and the Triton fused MoE against the reference.

The Triton kernel runs on a CPU in interpreter mode (TRITON_INTERPRET=1 must be set before triton
is imported).
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from minisgl.moe.base import select_experts  # noqa: E402
from minisgl.moe.fused import FusedMoeBackend, moe_align_block_size  # noqa: E402
from minisgl.moe.torch_backend import TorchMoeBackend  # noqa: E402

torch.manual_seed(0)
T, H, I, E, K = 5, 64, 48, 8, 2
x, gating = torch.randn(T, H), torch.randn(T, E)
weights, ids = select_experts(gating, K, renormalize=True)
print("the experts each token picked:", ids.tolist())
print("routing weights (after renormalization):", [[round(w, 3) for w in row] for row in weights.tolist()])
sorted_ids, expert_ids = moe_align_block_size(ids, block_m=4, num_experts=E)
print("sorted by expert, padded to a multiple of 4 (10 is the placeholder):", sorted_ids.tolist())
print("which expert each tile belongs to:", expert_ids.tolist())

x, gating = torch.randn(37, H), torch.randn(37, E)
w1, w2 = torch.randn(E, 2 * I, H) * 0.1, torch.randn(E, H, I) * 0.1
a = FusedMoeBackend().forward(x, w1, w2, gating, K, renormalize=True)
b = TorchMoeBackend().forward(x, w1, w2, gating, K, renormalize=True)
print(f"37 tokens: fused (Triton interpreter) against the reference, max error {(a - b).abs().max().item():.1e}")
