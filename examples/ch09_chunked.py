"""Chapter 9: chunked prefill.

A prefill forward takes at most a budget of prompt tokens. A prompt longer than what is left of
the budget runs in chunks, one per step, and its first token is sampled after its last chunk. The
tokens are the same for every chunk size.
"""

from __future__ import annotations

import tempfile

import tiny_models
import torch
from transformers import AutoTokenizer
from transformers.utils import logging

from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig

torch.set_num_threads(1)
logging.set_verbosity_error()

LONG = "Once upon a time there was a small robot who lived in a library. Every night"
SHORT = ["Hello world", "The quick brown fox"]

with tempfile.TemporaryDirectory() as tmp:
    path = str(tiny_models.make_tiny_model("mistral", f"{tmp}/mistral"))
    tok = AutoTokenizer.from_pretrained(path)
    s = Scheduler(
        SchedulerConfig(
            path,
            device="cpu",
            page_size=4,
            num_pages=64,
            max_running_req=4,
            max_extend_tokens=8,
            cache_type="naive",
        )
    )
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    prompts = [tok.encode(p) for p in [SHORT[0], LONG, SHORT[1]]]
    reqs = [s.add_req(p, params) for p in prompts]
    print(f"budget 8 prompt tokens a prefill; prompts of {[len(p) for p in prompts]} tokens")
    print("step  phase    tokens run per request (uid:n)     sampled")
    step = 0
    while True:
        before = [len(r.output_ids) for r in reqs]
        if (out := s.step()) is None:
            break
        ran = " ".join(f"{u}:{n}" for u, n in zip(out.uids, out.extend_lens))
        sampled = [r.uid for r, n in zip(reqs, before) if len(r.output_ids) > n]
        print(f"{step:4d}  {out.phase:7s}  {ran:34s} {sampled}")
        step += 1
    for r in reqs:
        print(f"  request {r.uid}: {r.output_ids} {tok.decode(r.output_ids)!r}")

    print(f"\nthe {len(prompts[1])}-token prompt alone, every chunk size:")
    reference = None
    for budget in (1, 2, 3, 5, 8, 13, len(prompts[1])):
        s.config.max_extend_tokens = budget
        req = s.add_req(prompts[1], SamplingParams(max_tokens=8, ignore_eos=True))
        chunks = []
        while (out := s.step()) is not None:
            if out.phase == "prefill":
                chunks.append(out.extend_lens[0])
        if reference is None:
            reference = req.output_ids
            print(f"  tokens {reference}")
        print(
            f"  budget {budget:2d}: chunks {chunks}, the same tokens: {req.output_ids == reference}"
        )
