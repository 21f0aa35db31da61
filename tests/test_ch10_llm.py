"""Chapter 10: the offline LLM API. Batches of mixed-length prompts (text or token ids) give what
transformers gives each alone; seeded sampling repeats; bad requests are refused by name and the
LLM goes on serving."""

from __future__ import annotations

import pytest
from helpers import DENSE, build_llm, encode, greedy, hf_greedy
from minisgl.core import SamplingParams
from minisgl.llm import LLM

PROMPTS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "Once upon a time",
           "1 2 3 4 5 6 7 8 9 10.", "def add(a, b): return a + b", "A"]


@pytest.mark.parametrize("family", DENSE)
def test_generate_equals_transformers_greedy(tiny_models, family):
    path = tiny_models[family]
    llm = build_llm(path)
    prompts = PROMPTS[:3] + [encode(path, p) for p in PROMPTS[3:]]  # text and token ids
    out = llm.generate(prompts, greedy(10))
    assert [o["token_ids"] for o in out] == hf_greedy(path, prompts, 10)
    tok = llm.tokenizer
    assert all(o["text"] == tok.decode(o["token_ids"], skip_special_tokens=True) for o in out)
    assert out[0]["prompt_token_ids"] == encode(path, PROMPTS[0])
    llm.shutdown()


def test_one_sampling_params_per_prompt(tiny_models):
    path = tiny_models["qwen3"]
    llm = build_llm(path)
    out = llm.generate(PROMPTS[:3], [greedy(2), greedy(7), greedy(4)])
    assert [len(o["token_ids"]) for o in out] == [2, 7, 4]
    assert [o["token_ids"] for o in out] == [
        r[:n] for r, n in zip(hf_greedy(path, PROMPTS[:3], 7), [2, 7, 4])]
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate(PROMPTS[:3], [greedy(2)])


def test_seeded_sampling_is_reproducible(tiny_models):
    path = tiny_models["llama3"]
    params = [SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.8, top_k=40, top_p=0.9, max_tokens=12,
                             ignore_eos=True)]
    runs = []
    for seed in (7, 7, 8):
        llm = LLM(str(path), device="cpu", page_size=4, num_pages=128, seed=seed)
        runs.append([o["token_ids"] for o in llm.generate(PROMPTS[:2], params)])
        llm.shutdown()
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_bad_requests_are_refused_and_the_llm_keeps_serving(tiny_models):
    path = tiny_models["mistral"]
    llm = LLM(str(path), device="cpu", page_size=4, num_pages=64, max_seq_len=48)
    zero, cold = greedy(3), greedy(3)
    zero.max_tokens, cold.temperature = 0, -1.0  # changed after construction, past its checks
    too_long = " ".join(PROMPTS * 4)
    cases = [([""], greedy(3), "prompt"), ([too_long], greedy(3), "max_seq_len"),
             (["Hello"], zero, "max_tokens"), (["Hello"], cold, "temperature")]
    for prompts, params, field in cases:  # two good requests, then the bad one
        with pytest.raises(ValueError, match=f"request 2: .*{field}"):
            llm.generate(PROMPTS[:2] + prompts, [greedy(3), greedy(3), params])
    assert llm.scheduler.idle  # nothing of the refused calls was queued
    out = llm.generate(PROMPTS[:4], greedy(6))
    assert [o["token_ids"] for o in out] == hf_greedy(path, PROMPTS[:4], 6)
    llm.scheduler.cache_manager.check_integrity()


def test_generation_stops_at_eos(tiny_models):
    path = tiny_models["qwen2"]
    llm = build_llm(path)
    ref = hf_greedy(path, PROMPTS[:1], 8)[0]
    llm.scheduler.eos_token_id = ref[3]  # pretend the 4th token ends the sequence
    out = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=8))[0]
    assert out["token_ids"] == ref[: ref.index(ref[3]) + 1]
