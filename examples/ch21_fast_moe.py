"""Chapter 21: chapter 20's routing and alignment moved onto the GPU's side (no count read back
to the host), the tile sizes each batch size gets, and both of the sync-free MoE's paths against the
reference.

The Triton kernels run on a CPU in interpreter mode (TRITON_INTERPRET=1 must be set before
triton is imported).
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from minisgl.kernel.moe_routing import align, max_tiles, route  # noqa: E402
from minisgl.moe.configs import default_config, load_tuned, nearest  # noqa: E402
from minisgl.moe.fused import moe_align_block_size  # noqa: E402
from minisgl.moe.sync_free import SyncFreeMoeBackend  # noqa: E402
from minisgl.moe.torch_backend import TorchMoeBackend  # noqa: E402

torch.manual_seed(0)
T, H, I, E, K = 5, 64, 48, 8, 2
x, gating = torch.randn(T, H), torch.randn(T, E)  # chapter 20's main's first draws
weights, ids, block_counts = route(gating, K, renormalize=True)  # one launch
print("routing in one kernel, the experts each token picked:", ids.tolist())
print("pairs per expert, counted by the same kernel:", block_counts.sum(0).tolist())
sorted_ids, expert_ids, num_padded = align(ids, block_counts, E, block_m=4)
used = int(num_padded)  # read here to print; the layer itself never reads it on the host
print(
    f"aligned on the device: {used} of {sorted_ids.numel()} slots used, tiles "
    f"{expert_ids.tolist()} (-1: a tile this routing did not need)"
)
ch20_sorted, ch20_experts = moe_align_block_size(ids, block_m=4, num_experts=E)
print(
    "the same order as chapter 20's:",
    torch.equal(sorted_ids[:used], ch20_sorted)
    and torch.equal(expert_ids[: used // 4], ch20_experts),
)

print("\nQwen3-30B-A3B (128 experts, top-8): tiles the buffers are sized for, whatever the routing")
for tokens in (1, 64, 4096):
    pairs = tokens * 8
    sizes = ", ".join(f"BLOCK_M {m}: {max_tiles(pairs, 128, m)}" for m in (16, 64, 128))
    print(f"  T={tokens:<5} {pairs:>6} pairs -> {sizes}")

print("\nthe config each batch size gets (heuristic | tuned on an H200, nearest T)")
tuned = load_tuned("E=128,N=768,dtype=bf16,device=NVIDIA_H200.json") or {}
for tokens in (1, 16, 17, 64, 512, 4096):
    guess = default_config(tokens, 8, 128)
    best = nearest(tuned, tokens) if tuned else {}
    print(
        f"  T={tokens:<5} {guess['path']:<7} BLOCK_M {guess.get('BLOCK_M', '-'):<3} | "
        f"{best.get('path', '-'):<7} BLOCK_M {best.get('BLOCK_M', '-')}"
    )

x, gating = torch.randn(37, H), torch.randn(37, E)
w1, w2 = torch.randn(E, 2 * I, H) * 0.1, torch.randn(E, H, I) * 0.1
want = TorchMoeBackend().forward(x, w1, w2, gating, K, renormalize=True)
sync_free = SyncFreeMoeBackend()
print()
for tokens in (3, 37):  # 3 tokens take the decode path (three launches), 37 the aligned one
    got = sync_free.forward(x[:tokens], w1, w2, gating[:tokens], K, renormalize=True)
    err = (got - want[:tokens]).abs().max().item()
    print(
        f"{tokens} tokens, {default_config(tokens, K, E)['path']} path, against the "
        f"reference: max error below 1e-6: {err < 1e-6}"
    )
