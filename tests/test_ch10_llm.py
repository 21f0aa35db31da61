"""Chapter 10: the offline LLM API. Batches of mixed-length prompts (text or token ids) give what
transformers gives each alone; seeded sampling repeats; bad requests are refused by name and the
LLM goes on serving."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import DENSE, build_llm, encode, greedy, hf_greedy, hf_model, hf_tokenizer
from safetensors.torch import load_file, save_file

from minisgl.core import SamplingParams
from minisgl.llm import LLM

PROMPTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time",
    "1 2 3 4 5 6 7 8 9 10.",
    "def add(a, b): return a + b",
    "A",
]


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
        r[:n] for r, n in zip(hf_greedy(path, PROMPTS[:3], 7), [2, 7, 4])
    ]
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate(PROMPTS[:3], [greedy(2)])


def test_seeded_sampling_is_reproducible(tiny_models):
    path = tiny_models["llama3"]
    params = [
        SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.8, top_k=40, top_p=0.9, max_tokens=12, ignore_eos=True),
    ]
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
    cases = [
        ([""], greedy(3), "prompt"),
        ([too_long], greedy(3), "max_seq_len"),
        (["Hello"], zero, "max_tokens"),
        (["Hello"], cold, "temperature"),
    ]
    for prompts, params, field in cases:  # two good requests, then the bad one
        with pytest.raises(ValueError, match=f"request 2: .*{field}"):
            llm.generate(PROMPTS[:2] + prompts, [greedy(3), greedy(3), params])
    assert llm.scheduler.idle  # nothing of the refused calls was queued
    out = llm.generate(PROMPTS[:4], greedy(6))
    assert [o["token_ids"] for o in out] == hf_greedy(path, PROMPTS[:4], 6)
    llm.scheduler.cache_manager.check_integrity()


def test_one_prompt_not_in_a_list_is_refused(tiny_models):
    path = tiny_models["llama3"]
    llm = build_llm(path)
    for one in ["Hello world", encode(path, "Hello world")]:  # text, or token ids
        with pytest.raises(TypeError, match="list of prompts"):
            llm.generate(one, greedy(3))
    assert llm.scheduler.idle
    out = llm.generate(["Hello world"], greedy(3))  # the same prompt in a list is served
    assert [o["token_ids"] for o in out] == hf_greedy(path, ["Hello world"], 3)


def test_token_ids_outside_the_vocabulary_are_refused(tiny_models):
    path = tiny_models["qwen2"]
    llm = build_llm(path)
    vocab_size = llm.scheduler.engine.model_config.vocab_size
    bad = [
        ([5, vocab_size], r"input_ids\[1\] is 450"),
        ([-1], r"input_ids\[0\] is -1"),
        ([True, 5], r"input_ids\[0\] is True"),
        ([5, 7.9], r"input_ids\[1\] is 7.9"),
    ]
    for ids, message in bad:  # two good requests, then the bad one
        with pytest.raises(ValueError, match=f"request 2: {message}"):
            llm.generate(PROMPTS[:2] + [ids], greedy(3))
    assert llm.scheduler.idle
    ids = [0, 17, vocab_size - 1]  # numpy's and torch's integers are token ids too
    out = llm.generate([ids, np.array(ids), torch.tensor(ids)], greedy(4))
    assert [o["token_ids"] for o in out] == hf_greedy(path, [ids], 4) * 3
    assert all(type(t) is int for o in out for t in o["prompt_token_ids"])


# ---- EOS and special tokens, made to occur in every family -----------------------------------

IM_END = 2  # "<|im_end|>": a special token, which no family emits for these prompts by itself


def _copy_model(src, dst, emit_im_end_for: int | None = None, **generation_config):
    """A copy of a tiny model, its generation_config.json updated with ``generation_config``.
    ``emit_im_end_for``: <|im_end|> gets that token's output row, scaled up by 5%, so the copy
    emits <|im_end|> where the original emits that token (a positive logit)."""
    shutil.copytree(src, dst)
    file = dst / "generation_config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **generation_config}))
    if emit_im_end_for is not None:
        weights = load_file(dst / "model.safetensors")
        head = weights["lm_head.weight"]  # the untied families only
        head[IM_END] = 1.05 * head[emit_im_end_for]
        save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("family", ["llama3", "qwen3", "mistral"])
def test_special_tokens_are_left_out_of_the_text(tiny_models, tmp_path, family):
    """Not only when a family happens to emit one: here every family emits <|im_end|> mid-way."""
    original = tiny_models[family]
    path = _copy_model(
        original, tmp_path / family, emit_im_end_for=hf_greedy(original, PROMPTS[:1], 4)[0][3]
    )
    ref = hf_greedy(path, PROMPTS[:1], 10)[0]
    assert ref[3] == IM_END and ref.count(IM_END) == 1  # the copy emits it, once
    llm = build_llm(path)
    out = llm.generate(PROMPTS[:1], greedy(10))[0]
    assert out["token_ids"] == ref
    tok = llm.tokenizer
    assert out["text"] == tok.decode(ref[:3]) + tok.decode(ref[4:])
    assert "<|im_end|>" not in out["text"] and "<|im_end|>" in tok.decode(ref)


def test_generation_config_eos_ends_requests_and_leaves_the_text(tiny_models, tmp_path):
    """generation_config.json names two EOS ids: <|im_end|> (special) and an ordinary token.
    Each ends a request; its token_ids keep the EOS, its text drops it; ignore_eos runs on."""
    original = tiny_models["llama3"]
    prompts = PROMPTS[:2]
    ordinary = hf_greedy(original, prompts, 5)[1][4]  # request 1's 5th token
    path = _copy_model(
        original,
        tmp_path / "llama3",
        eos_token_id=[IM_END, ordinary],
        emit_im_end_for=hf_greedy(original, prompts, 4)[0][3],
    )
    ref = hf_greedy(path, prompts, 10)
    assert ref[0].index(IM_END) == 3 and ordinary not in ref[0][:3]
    assert ref[1].index(ordinary) == 4 and IM_END not in ref[1][:4]
    llm = build_llm(path)
    stopped = llm.generate(prompts, SamplingParams(max_tokens=10))
    ignoring = llm.generate(prompts[:1], greedy(10))[0]
    assert [o["token_ids"] for o in stopped] == [ref[0][:4], ref[1][:5]]
    tok = llm.tokenizer
    assert [o["text"] for o in stopped] == [tok.decode(ref[0][:3]), tok.decode(ref[1][:4])]
    assert tok.decode([ordinary]) and not stopped[1]["text"].endswith(tok.decode([ordinary]))
    assert ignoring["token_ids"] == ref[0]
    assert ignoring["text"] == tok.decode(ref[0][:3]) + tok.decode(ref[0][4:])


def test_an_eos_that_an_ignoring_request_ends_on_stays_in_the_text(tiny_models, tmp_path):
    """A request that ignores EOS ends at max_tokens: if its last token happens to be an EOS id
    (here an ordinary token), it is text like any other, not an end dropped from the text."""
    original = tiny_models["llama3"]
    ref = hf_greedy(original, PROMPTS[1:2], 5)[0]
    llm = build_llm(_copy_model(original, tmp_path / "llama3", eos_token_id=[ref[4]]))
    out = llm.generate(PROMPTS[1:2], greedy(5))[0]
    tok = llm.tokenizer
    assert out["token_ids"] == ref and tok.decode(ref) != tok.decode(ref[:4])
    assert out["text"] == tok.decode(ref)


# ---- a real model: SmolLM2-135M-Instruct (examples/real_model.py) ---------------------------

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "What does a GPU do?"},
        {"role": "assistant", "content": "It runs many small computations at once."},
        {"role": "user", "content": "And a CPU?"},
    ],
]


def _chat_ids(path, messages):
    return hf_tokenizer(path).apply_chat_template(messages, add_generation_prompt=True)["input_ids"]


@torch.inference_mode()
def _hf_reply(path, prompt_ids, n):
    """transformers' greedy reply: up to ``n`` tokens, ending at its EOS if one comes first."""
    ids = torch.tensor([prompt_ids])
    out = hf_model(path).generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False
    )
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_a_saved_checkpoint_has_the_modes_of_any_file_the_user_writes(tiny_models, tmp_path, umask):
    """real_model.py saves through transformers and safetensors, which writes the weights 0600,
    into a folder that tempfile.mkdtemp made 0700: both end as open and mkdir make them."""
    import tempfile

    import real_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_models["llama3"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["llama3"])
    old = os.umask(umask)
    try:
        path = Path(tempfile.mkdtemp(dir=tmp_path))
        real_model.save_checkpoint(model, tokenizer, path)
    finally:
        os.umask(old)
    modes = {f.name: oct(f.stat().st_mode & 0o777) for f in path.iterdir()}
    assert modes["model.safetensors"] == oct(0o666 & ~umask)
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes
    assert oct(path.stat().st_mode & 0o777) == oct(0o777 & ~umask)


def test_a_real_model_replies_as_transformers(real_model):
    """Greedy replies to chat prompts, batched, token for token as transformers (float32): 30
    layers, 9 query heads over 3 KV heads, a tied LM head, trained weights."""
    prompts = [_chat_ids(real_model, chat) for chat in CHATS]
    llm = build_llm(real_model)
    out = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24))
    llm.shutdown()
    refs = [_hf_reply(real_model, p, 24) for p in prompts]
    assert [o["token_ids"] for o in out] == refs
    assert len(refs[1]) == 24  # the haiku runs to max_tokens: a reply long enough to go wrong


def test_a_real_models_reply_ends_at_the_eos_of_its_generation_config(real_model):
    """generation_config.json names <|im_end|>: the reply stops there (the EOS kept in its ids,
    not in its text); with ignore_eos it runs on to max_tokens."""
    eos = json.loads((real_model / "generation_config.json").read_text())["eos_token_id"]
    assert eos == hf_tokenizer(real_model).convert_tokens_to_ids("<|im_end|>")
    prompt = _chat_ids(real_model, CHATS[0])
    llm = build_llm(real_model)
    assert llm.scheduler.eos_token_ids == (eos,)
    stopped = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=32))[0]
    ignoring = llm.generate([prompt], greedy(len(stopped["token_ids"]) + 4))[0]
    llm.shutdown()
    ids = stopped["token_ids"]
    assert len(ids) < 32 and ids[-1] == eos and eos not in ids[:-1]
    assert ignoring["token_ids"][: len(ids)] == ids and len(ignoring["token_ids"]) == len(ids) + 4
    assert "<|im_end|>" not in stopped["text"] and "Paris" in stopped["text"]
