"""Chapter 4: sampling.

Each request says how its next token is picked (SamplingParams): greedy, or drawn after a
temperature, a top-k and a top-p filter. One call samples a whole batch, every row with its own
settings, from a seeded generator, so a run can be repeated token for token.
"""

from __future__ import annotations

import tempfile

import tiny_models
import torch
from transformers import AutoTokenizer

from minisgl.core import Batch, Context, Req, SamplingParams, get_global_ctx, set_global_ctx
from minisgl.engine.sample import BatchSamplingArgs, Sampler, top_k_top_p_filter
from minisgl.models import load_model, sequence_logits

torch.set_num_threads(1)


def rounded(t: torch.Tensor) -> list[float]:
    return [round(x, 3) for x in t.tolist()]


logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -2.0]])
print("one row of logits:", logits[0].tolist())
for t in (0.5, 1.0, 2.0):
    print(f"  temperature {t}: probabilities {rounded(torch.softmax(logits[0] / t, -1))}")
probs = torch.softmax(logits, -1)
for k, p in ((3, 1.0), (-1, 0.8), (3, 0.6)):
    kept = top_k_top_p_filter(probs, torch.tensor([k]), torch.tensor([p]))[0]
    print(f"  top_k {k:2d}, top_p {p}: keeps tokens {kept.nonzero().flatten().tolist()}")

n = 10_000
params = SamplingParams(temperature=1.0, top_k=3)
draws = Sampler(seed=0).sample(logits.expand(n, -1), BatchSamplingArgs.from_params([params] * n))
kept = top_k_top_p_filter(probs, torch.tensor([3]), torch.tensor([1.0]))[0]
print(
    f"{n} draws with top_k 3: counts {torch.bincount(draws, minlength=6).tolist()}, "
    f"expected about {[round(x) for x in (n * kept / kept.sum()).tolist()]}"
)

with tempfile.TemporaryDirectory() as tmp:
    path = tiny_models.make_tiny_model("llama3", f"{tmp}/llama3")
    model = load_model(path)
    tok = AutoTokenizer.from_pretrained(path)
    set_global_ctx(Context())

    def step(sampler: Sampler) -> list[int]:
        """One token for every request of the context's batch (recomputing each sequence)."""
        batch = get_global_ctx().batch
        rows = torch.stack([sequence_logits(model, r.all_ids)[-1] for r in batch.reqs])
        return sampler.sample(rows, sampler.prepare(batch)).tolist()

    def generate(seed: int) -> list[Req]:
        prompt = tok.encode("Once upon a time")
        reqs = [
            Req(0, prompt, SamplingParams(max_tokens=12)),
            Req(1, prompt, SamplingParams(temperature=0.8, top_k=20, max_tokens=12)),
            Req(2, prompt, SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12)),
        ]
        sampler = Sampler(seed=seed)
        # each step batches the requests still running: a finished one takes no more tokens
        while running := [r for r in reqs if not r.is_finished(tok.eos_token_id)]:
            with get_global_ctx().forward_batch(Batch(running)):
                for req, token in zip(running, step(sampler)):
                    req.append(token)
        return reqs

    print("\n'Once upon a time', three requests in one batch (tiny llama3, seed 0):")
    first = generate(seed=0)
    for req in first:
        p = req.sampling_params
        how = f"temperature {p.temperature}, top_k {p.top_k}, top_p {p.top_p}"
        how = "greedy" if p.is_greedy else how
        print(f"  {how:38s} {req.output_ids}\n  {'':38s} {tok.decode(req.output_ids)!r}")
    again = generate(seed=0)
    print(
        "the same seed again gives the same tokens:",
        [r.output_ids for r in again] == [r.output_ids for r in first],
    )
    other = generate(seed=1)
    print(
        "seed 1: the greedy row is unchanged:",
        other[0].output_ids == first[0].output_ids,
        "| both sampled rows differ:",
        all(other[i].output_ids != first[i].output_ids for i in (1, 2)),
    )
