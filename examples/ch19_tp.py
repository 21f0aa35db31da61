"""Chapter 19: tensor parallelism.

Every weight is cut over the ranks as it is read: q/k/v, gate and up by their output rows,
o_proj and down by their input columns, the vocabulary by rows. Each rank is a process of its
own; after o_proj and after down the ranks add up their partial sums (an all-reduce), the
embedding sums its ranks' rows the same way, and the LM head gathers the ranks' slices of the
vocabulary. On a CPU the ranks talk over gloo; on GPUs the same code goes over NCCL.
"""

from __future__ import annotations

import tempfile

import tiny_models
import torch

from minisgl.core import SamplingParams
from minisgl.distributed import DistributedCommunicator, set_tp_info
from minisgl.llm import LLM
from minisgl.models import load_model

torch.set_num_threads(1)
NAMES = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.qkv_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.gate_up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.0.input_layernorm.weight",
    "lm_head.weight",
]


def rank_weights(path: str, rank: int, size: int) -> dict[str, torch.Tensor]:
    """The weights rank ``rank`` of ``size`` loads: building and loading need no process group,
    only ``get_tp_info`` saying which rank this is."""
    set_tp_info(rank, size)
    try:
        return load_model(path).state_dict()
    finally:
        set_tp_info(0, 1)


def count_collectives(llm: LLM, prompt: list[int], n: int) -> dict[str, int]:
    """How many all-reduces and all-gathers rank 0 makes while generating ``n`` tokens."""
    counts = {"all_reduce": 0, "all_gather": 0}
    originals = {name: getattr(DistributedCommunicator, name) for name in counts}

    def counting(name: str):
        def call(self, x: torch.Tensor) -> torch.Tensor:
            counts[name] += 1
            return originals[name](self, x)

        return call

    for name in counts:
        setattr(DistributedCommunicator, name, counting(name))
    try:
        llm.generate([prompt], SamplingParams(max_tokens=n, ignore_eos=True))
    finally:
        for name, fn in originals.items():
            setattr(DistributedCommunicator, name, fn)
    return counts


def main() -> None:
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8], list(range(30, 50))]
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    options = dict(device="cpu", page_size=4, num_pages=128, max_running_req=4)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(tiny_models.make_tiny_model("llama3", f"{tmp}/llama3"))
        whole = rank_weights(path, 0, 1)
        parts = [rank_weights(path, r, 2) for r in range(2)]
        print("weight shapes, one rank vs each of two:")
        for name in NAMES:
            short = name.removeprefix("model.").removeprefix("layers.0.")
            print(
                f"  {short:26s} {str(list(whole[name].shape)):10s} -> {list(parts[0][name].shape)}"
            )
        qkv = [p["model.layers.0.self_attn.qkv_proj.weight"] for p in parts]
        q = torch.cat([w[:32] for w in qkv])  # each rank's 2 query heads of 16: rows 0..31
        print(
            f"  the ranks' q rows, put together, are the whole q: "
            f"{torch.equal(q, whole['model.layers.0.self_attn.qkv_proj.weight'][:64])}"
        )
        down = torch.cat([p["model.layers.0.mlp.down_proj.weight"] for p in parts], dim=1)
        print(
            f"  the ranks' down columns, side by side, are the whole down: "
            f"{torch.equal(down, whole['model.layers.0.mlp.down_proj.weight'])}"
        )

        one = LLM(path, **options)
        ref = [r["token_ids"] for r in one.generate(prompts, greedy)]
        one.shutdown()
        two = LLM(path, tp_size=2, **options)  # this process is rank 0; rank 1 is spawned
        out = [r["token_ids"] for r in two.generate(prompts, greedy)]
        print("greedy tokens, tp_size=2 (two processes over gloo):")
        for tokens in out:
            print(f"  {tokens}")
        print(f"identical to tp_size=1: {out == ref}")
        counts = count_collectives(two, prompts[0], 4)
        two.shutdown()
    print(
        f"4 forwards of a 2-layer model on rank 0: {counts['all_reduce']} all-reduces "
        f"({counts['all_reduce'] // 4} per forward: the embedding, then o_proj and down in "
        f"each layer), {counts['all_gather']} all-gathers (the LM head)"
    )


if __name__ == "__main__":
    main()
