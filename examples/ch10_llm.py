"""Chapter 10: the offline LLM API.

``LLM(model_path, **engine_options).generate(prompts, sampling_params)`` queues every prompt
(text or token ids) in the scheduler at once and runs it until all are done: the engine, the KV
cache, continuous batching, the radix cache and chunked prefill, behind one call.
"""

from __future__ import annotations

import tempfile

import tiny_models
import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging

from minisgl.core import SamplingParams
from minisgl.llm import LLM

torch.set_num_threads(1)
logging.set_verbosity_error()

PROMPTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time",
    "1 2 3 4 5",
]

with tempfile.TemporaryDirectory() as tmp:
    path = str(tiny_models.make_tiny_model("qwen3", f"{tmp}/qwen3"))
    llm = LLM(
        path, device="cpu", page_size=4, num_pages=128, max_running_req=4, max_extend_tokens=16
    )
    greedy = SamplingParams(max_tokens=10, ignore_eos=True)
    outputs = llm.generate(PROMPTS, greedy)
    print(f"{len(PROMPTS)} prompts, greedy, 10 tokens each:")
    for prompt, out in zip(PROMPTS, outputs):
        print(f"  {prompt!r} ({len(out['prompt_token_ids'])} tokens) -> {out['text']!r}")

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    same = True
    for out in outputs:
        ids = torch.tensor([out["prompt_token_ids"]])
        ref = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=10,
            do_sample=False,
            eos_token_id=None,
        )[0, ids.shape[1] :].tolist()
        same &= ref == out["token_ids"]
    print("the same tokens as transformers' generate, prompt by prompt:", same)

    ids = llm.tokenizer.encode("The weather today is")
    print(
        f"\na prompt given as token ids {ids}:",
        repr(llm.generate([ids], SamplingParams(max_tokens=6, ignore_eos=True))[0]["text"]),
    )

    sampled = [
        SamplingParams(temperature=0.8, top_k=50, max_tokens=8, ignore_eos=True),
        SamplingParams(temperature=1.2, top_p=0.9, max_tokens=8, ignore_eos=True),
    ]
    runs = []
    for seed in (1, 1, 2):
        seeded = LLM(path, device="cpu", page_size=4, num_pages=64, seed=seed)
        runs.append([o["token_ids"] for o in seeded.generate(PROMPTS[:2], sampled)])
        seeded.shutdown()
    print("\nsampled with seed 1:", runs[0])
    print(
        "seed 1 again gives the same tokens:",
        runs[0] == runs[1],
        "| seed 2 differs:",
        runs[0] != runs[2],
    )

    try:
        llm.generate(["Hello", ""], greedy)
    except ValueError as e:
        print(f"\na bad request is refused: {e}")
    print("and the LLM keeps serving:", llm.generate(PROMPTS[:1], greedy)[0] == outputs[0])
    llm.shutdown()
