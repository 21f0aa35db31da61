"""Chapter 17: CUDA graphs for decode.

Decode batches run as a replay of a graph captured for their size: 1, 2, 4, then every 8 up to
a maximum. A batch is padded up to the next captured size with the dummy request, whose token
is written to the dummy page. On a CPU nothing is captured, but with a maximum given the engine
pads the same way, so the choice of size and the padding show here, and the tokens must not
change.
"""

from __future__ import annotations

import tempfile

import tiny_models
import torch

from minisgl.core import SamplingParams
from minisgl.engine.graph import graph_batch_sizes, padded_size
from minisgl.llm import LLM

torch.set_num_threads(1)

print(f"captured sizes up to 256: {len(graph_batch_sizes(256))} graphs")
print(f"  {graph_batch_sizes(256)[:8]} ... {graph_batch_sizes(256)[-2:]}")
sizes = graph_batch_sizes(20)
print(f"captured sizes up to 20: {sizes}")
for bs in (1, 3, 5, 8, 13, 16):
    size = padded_size(sizes, bs)
    assert size is not None
    print(f"  a decode batch of {bs:2d} runs the graph of {size:2d}: {size - bs} dummy rows")
print(f"  a decode batch of 17 has no graph ({padded_size(sizes, 17)}): an ordinary forward")

prompts = [[3, 1, 4, 1, 5], [2, 7, 1, 8], list(range(30, 45)), [6] * 9, [9, 9]]
lengths = [6, 2, 9, 4, 7]  # requests leave at different steps: the batch shrinks
params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]

with tempfile.TemporaryDirectory() as tmp:
    path = str(tiny_models.make_tiny_model("llama3", f"{tmp}/llama3"))
    runs = {}
    for max_bs in (None, 4):
        llm = LLM(path, device="cpu", page_size=4, cuda_graph_max_bs=max_bs)
        engine = llm.scheduler.engine
        steps: list[str] = []
        forward_batch = engine.forward_batch

        def traced(batch, runner=engine.graph_runner, forward_batch=forward_batch):
            if batch.is_prefill:
                steps.append(f"prefill({batch.size})")
            elif runner.can_run(batch):
                steps.append(f"{batch.size}->{runner.pad(batch).size}")
            else:
                steps.append(f"{batch.size}(no graph)")
            return forward_batch(batch)

        engine.forward_batch = traced
        runs[max_bs] = [out["token_ids"] for out in llm.generate(prompts, params)]
        print(f"\ncuda_graph_max_bs={max_bs}: sizes {engine.graph_runner.sizes}")
        print(f"  steps, batch -> padded: {' '.join(steps)}")
        dummy = engine.dummy_req.table_idx
        print(
            f"  the dummy request: page-table row {dummy}, its token in slot "
            f"{engine.page_table[dummy, 0].item()} (page {engine.num_pages}, never handed out)"
        )
    print(f"\nsame tokens padded or not: {runs[None] == runs[4]}")
    for prompt, tokens in zip(prompts, runs[4]):
        print(f"  {len(prompt):2d} prompt tokens -> {tokens}")
