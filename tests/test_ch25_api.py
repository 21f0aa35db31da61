"""Chapter 25, the sampling half, offline: log-probabilities of sampled tokens, their top-k
alternatives and a prompt's own (echo) equal transformers' log-softmax on the same weights, with
chunked prefill, a prompt already in the prefix cache, and penalties; penalties and logit bias
equal a literal reference loop, with overlap scheduling too, and leave the rows that do not ask
alone; n choices share the prompt's pages, each with its seed; the messages, the token bytes and
the OpenAI shapes of log-probabilities; bad values get one clear error each."""

from __future__ import annotations

import math
from typing import Any, List, Sequence

import pytest
import torch
from helpers import DENSE, assert_pages_all_back, greedy, hf_logits

PROMPT = [5, 17, 33, 101, 7, 9, 200, 13, 44, 61, 3, 250, 88, 120, 64, 19, 301]  # 17 tokens
OTHER = [40, 41, 42, 43, 44, 45, 46, 47, 48]
ATOL = 2e-4  # float32 log-softmax of two implementations of the same forward


def _llm(path: Any, **options: Any) -> Any:
    from minisgl.llm import LLM

    settings = dict(device="cpu", page_size=4, num_pages=256, max_running_req=8)
    return LLM(str(path), **{**settings, **options})


def _params(**fields: Any) -> Any:
    from minisgl.core import SamplingParams

    return SamplingParams(**{"max_tokens": 6, "ignore_eos": True, **fields})


def _hf_logprobs(path: Any, ids: Sequence[int]) -> torch.Tensor:
    """transformers' log-softmax [T, V] over one whole sequence, float32."""
    return torch.log_softmax(hf_logits(path, ids), dim=-1)


def _assert_entries(lp: Any, ref: torch.Tensor, ids: Sequence[int], first: int, k: int) -> None:
    """Entries of ``lp`` are tokens ids[first], ids[first + 1], ...: each log-probability is
    ref's at the position before, and the top k are ref's k largest, in order."""
    for j, (token, logprob, top_ids, top_lps) in enumerate(
        zip(lp.token_ids, lp.logprobs, lp.top_ids, lp.top_logprobs)
    ):
        position = first + j
        assert token == ids[position]
        row = ref[position - 1]
        assert logprob == pytest.approx(row[token].item(), abs=ATOL)
        values, indices = row.topk(k)
        assert top_lps == pytest.approx(values.tolist(), abs=ATOL)
        assert len(top_ids) == k
        # near-equal alternatives may trade places: compare the sets where values tie
        assert set(top_ids) == set(indices.tolist()) or _ties(values)


def _ties(values: torch.Tensor) -> bool:
    return bool((values[:-1] - values[1:]).abs().min() < ATOL)


# ---------------------------------------------------------------- log-probabilities
@pytest.mark.parametrize("family", [*DENSE, "qwen3moe"])
def test_prompt_and_output_logprobs_equal_transformers(tiny_models, family):
    """One echo request: every prompt token after the first, and every generated token, has
    transformers' log-softmax at the position before it, and the top 3 there."""
    path = tiny_models[family]
    out = _llm(path).generate([PROMPT], _params(logprobs=3, prompt_logprobs=3))[0]
    ids = PROMPT + out["token_ids"]
    ref = _hf_logprobs(path, ids)
    prompt_lp = out["prompt_logprobs"]
    assert len(prompt_lp) == len(PROMPT) and prompt_lp.token_ids == PROMPT
    assert prompt_lp.logprobs[0] is None and prompt_lp.top_ids[0] == []
    _assert_entries(prompt_lp.slice(1), ref, ids, 1, 3)
    _assert_entries(out["logprobs"], ref, ids, len(PROMPT), 3)


@pytest.mark.parametrize("chunk", [3, 5, 16])
def test_prompt_logprobs_with_chunked_prefill_and_a_neighbour(tiny_models, chunk):
    """Chunks of 3, 5 and 16 tokens, an echo request beside one that does not echo in the same
    prefill batches: the echo request's entries are exact, the other's output is greedy's."""
    path = tiny_models["llama3"]
    llm = _llm(path, max_extend_tokens=chunk)
    outs = llm.generate([OTHER, PROMPT], [greedy(4), _params(prompt_logprobs=2, logprobs=0)])
    ids = PROMPT + outs[1]["token_ids"]
    ref = _hf_logprobs(path, ids)
    _assert_entries(outs[1]["prompt_logprobs"].slice(1), ref, ids, 1, 2)
    _assert_entries(outs[1]["logprobs"], ref, ids, len(PROMPT), 0)
    plain = _llm(path).generate([OTHER], greedy(4))[0]
    assert outs[0]["token_ids"] == plain["token_ids"] and "prompt_logprobs" not in outs[0]
    assert_pages_all_back(llm.scheduler)


@pytest.mark.parametrize("chunk", [1, 2])
def test_a_one_row_chunk_keeps_its_prompt_entry_apart_from_the_bias(tiny_models, chunk):
    """Chunks that give the echo request one row, alone or beside a request of one row: that
    row is scored against the next prompt token and also sampled from. The bias and the
    penalties change the sampler's rows only, so its prompt entry is the model's own."""
    path = tiny_models["llama3"]
    bias = {token: -100.0 for token in PROMPT}  # every prompt token, so a leak is 100 off
    echo = _params(prompt_logprobs=1, logit_bias=bias, repetition_penalty=1.5, max_tokens=2)
    prompts, params = [PROMPT], [echo]
    if chunk == 2:  # a neighbour that also brings one row a step
        prompts, params = [[5], PROMPT], [greedy(len(PROMPT)), echo]
    outs = _llm(path, max_extend_tokens=chunk).generate(prompts, params)
    _assert_entries(outs[-1]["prompt_logprobs"].slice(1), _hf_logprobs(path, PROMPT), PROMPT, 1, 1)


def test_several_echo_requests_in_one_batch(tiny_models):
    """Three echo requests of different lengths and k, and one that does not echo, in the same
    prefill batches (chunks of 7): each echo request gets its own prompt's entries."""
    path = tiny_models["qwen2"]
    prompts = [PROMPT, OTHER, PROMPT[::-1][:11], [3, 1, 4, 1, 5]]
    params = [
        _params(prompt_logprobs=1),
        greedy(2),
        _params(prompt_logprobs=4),
        _params(prompt_logprobs=0, max_tokens=1),
    ]
    outs = _llm(path, max_extend_tokens=7).generate(prompts, params)
    for prompt, p, out in zip(prompts, params, outs):
        if p.prompt_logprobs is None:
            assert "prompt_logprobs" not in out
            continue
        lp = out["prompt_logprobs"]
        assert lp.token_ids == prompt
        _assert_entries(lp.slice(1), _hf_logprobs(path, prompt), prompt, 1, p.prompt_logprobs)


def _matched_lengths(llm: Any) -> List[int]:
    """The prefix each admitted request matched, recorded as it is admitted."""
    cache, matched = llm.scheduler.cache_manager, []
    match_req = cache.match_req

    def recording(req: Any) -> Any:
        handle = match_req(req)
        matched.append(handle.cached_len)
        return handle

    cache.match_req = recording
    return matched


def test_an_echo_request_matches_no_prefix_and_is_exact(tiny_models):
    """The prompt is in the radix cache already: an echo request still runs all of it (a
    cached prefix has no logits) and gets every entry; a request without echo after it
    shares the pages."""
    path = tiny_models["qwen3"]
    llm = _llm(path)
    matched = _matched_lengths(llm)
    llm.generate([PROMPT + [9]], greedy(3))
    echo = llm.generate([PROMPT], _params(prompt_logprobs=1, max_tokens=1))[0]
    llm.generate([PROMPT], greedy(1))
    assert matched == [0, 0, 16]  # the third shares 4 whole pages of 4 tokens
    ref = _hf_logprobs(path, PROMPT)
    _assert_entries(echo["prompt_logprobs"].slice(1), ref, PROMPT, 1, 1)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.5])
def test_logprobs_do_not_depend_on_temperature_top_k_or_top_p(tiny_models, temperature):
    """A sampled token's log-probability is the model's, before temperature, top-k and top-p:
    whatever the draw's settings, it is transformers' log-softmax at its position."""
    path = tiny_models["mistral"]
    params = _params(temperature=temperature, top_k=20, top_p=0.9, seed=7, logprobs=2)
    out = _llm(path).generate([PROMPT], params)[0]
    ids = PROMPT + out["token_ids"]
    _assert_entries(out["logprobs"], _hf_logprobs(path, ids), ids, len(PROMPT), 2)


def test_the_default_path_computes_no_logprobs_and_no_penalties(tiny_models):
    """A batch whose requests ask for nothing gets no plan, no extra logits rows, and the
    penalty counts are never allocated."""
    from minisgl.engine.engine import Engine

    llm = _llm(tiny_models["llama3"])
    batches = []
    forward_batch = Engine.forward_batch

    def spy(self: Any, batch: Any, *rest: Any) -> Any:
        tokens = forward_batch(self, batch, *rest)
        batches.append(batch)
        return tokens

    Engine.forward_batch = spy
    try:
        llm.generate([PROMPT, OTHER], greedy(3))
    finally:
        Engine.forward_batch = forward_batch
    assert batches and all(b.logprob_plan is None and b.sample_rows is None for b in batches)
    assert all(b.logprobs is None for b in batches)
    assert llm.scheduler.engine.penalties.counts is None


def test_a_grammar_leaves_no_impossible_alternative(tiny_models):
    """Under a regex, tokens the grammar forbids have probability 0: no alternative shows
    -inf, and the sampled token's log-probability is finite."""
    pytest.importorskip("xgrammar")
    out = _llm(tiny_models["llama3"]).generate(
        ["Numbers:"], _params(regex="[0-9]{3}", logprobs=5, max_tokens=8, ignore_eos=False)
    )[0]
    lp = out["logprobs"]
    assert len(lp) == len(out["token_ids"])
    assert all(math.isfinite(x) for x in lp.logprobs)
    assert all(math.isfinite(x) for row in lp.top_logprobs for x in row)
    assert any(len(row) < 5 for row in lp.top_logprobs)  # a digit position allows fewer


# ---------------------------------------------------------------- penalties and logit bias
def reference_penalized(
    logits: Sequence[float], prompt: Sequence[int], output: Sequence[int], p: Any
) -> List[float]:
    """The penalties as their definitions say, token by token."""
    changed = []
    for token, x in enumerate(logits):
        x += (p.logit_bias or {}).get(token, 0.0)
        if token in prompt or token in output:
            x = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
        count = output.count(token)
        x -= p.frequency_penalty * count
        x -= p.presence_penalty * (1 if count > 0 else 0)
        changed.append(x)
    return changed


def reference_greedy(path: Any, prompt: List[int], p: Any, n: int) -> List[int]:
    """Greedy decoding with the penalties applied by the loop above to transformers' logits."""
    output: List[int] = []
    for _ in range(n):
        logits = hf_logits(path, prompt + output)[-1].tolist()
        changed = reference_penalized(logits, prompt, output, p)
        output.append(max(range(len(changed)), key=changed.__getitem__))
    return output


PENALIZED = [
    dict(frequency_penalty=1.5),
    dict(presence_penalty=2.0, repetition_penalty=1.3),
    dict(repetition_penalty=0.7, frequency_penalty=-0.5),  # rewards repeats
    dict(logit_bias={88: 6.0, 250: -100.0, 19: 3.5}, presence_penalty=0.5),
    dict(),  # asks nothing: a plain row beside the others
]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("family", ["qwen2", "llama3"])
def test_penalties_and_logit_bias_equal_a_reference_loop(tiny_models, family, overlap):
    """Five rows of one batch with different penalties, greedy, 12 tokens: each row's tokens
    are those of the reference loop; with overlap scheduling too, where a step's penalty counts
    the token still on its way to the host."""
    path = tiny_models[family]
    params = [_params(max_tokens=12, **fields) for fields in PENALIZED]
    prompts = [PROMPT[i:] + PROMPT[:i] for i in range(len(params))]
    outs = _llm(path, overlap_scheduling=overlap).generate(prompts, params)
    for prompt, p, out in zip(prompts, params, outs):
        assert out["token_ids"] == reference_greedy(path, prompt, p, 12), p


def test_penalties_change_the_tokens_they_should(tiny_models):
    """The test above is not vacuous: on the tiny Qwen2, which repeats itself within 12
    tokens, each penalized row differs from plain greedy, and a bias of 100 makes every token
    the biased one."""
    path = tiny_models["qwen2"]
    llm = _llm(path)
    plain = llm.generate([PROMPT], _params(max_tokens=12))[0]["token_ids"]
    for fields in PENALIZED[:4]:
        changed = llm.generate([PROMPT], _params(max_tokens=12, **fields))[0]["token_ids"]
        assert changed != plain, fields
    forced = llm.generate([PROMPT], _params(logit_bias={"77": 100}, max_tokens=5))[0]
    assert forced["token_ids"] == [77] * 5


def test_a_sampled_tokens_logprob_is_after_its_penalties(tiny_models):
    """With a penalty and a bias, the token's log-probability is the log-softmax of the
    changed logits (the distribution it was drawn from, before temperature)."""
    path = tiny_models["qwen2"]
    p = _params(temperature=0.8, seed=3, logprobs=1, frequency_penalty=1.0, logit_bias={64: 2.0})
    out = _llm(path).generate([PROMPT], p)[0]
    output: List[int] = []
    for token, logprob in zip(out["token_ids"], out["logprobs"].logprobs):
        logits = hf_logits(path, PROMPT + output)[-1].tolist()
        changed = torch.tensor(reference_penalized(logits, PROMPT, output, p))
        assert logprob == pytest.approx(torch.log_softmax(changed, 0)[token].item(), abs=ATOL)
        output.append(token)


def test_apply_penalties_equals_the_reference_on_random_logits():
    """The tensor form against the loop, on random logits and histories, every penalty at
    once, rows of several requests."""
    from minisgl.core import SamplingParams
    from minisgl.engine.penalties import PenaltyArgs, apply_penalties

    g = torch.Generator().manual_seed(0)
    vocab, rows = 50, 4
    logits = torch.randn(rows, vocab, generator=g) * 3
    prompts = [torch.randint(vocab, (6,), generator=g).tolist() for _ in range(rows)]
    outputs = [torch.randint(vocab, (9,), generator=g).tolist() for _ in range(rows)]
    params = [
        SamplingParams(
            presence_penalty=0.3 * i,
            frequency_penalty=0.5 - 0.4 * i,
            repetition_penalty=1.0 + 0.25 * i,
            logit_bias={i: 1.5, 7: -2.0},
        )
        for i in range(rows)
    ]
    counts = torch.zeros(rows, vocab)
    seen = torch.zeros(rows, vocab, dtype=torch.bool)
    bias = torch.zeros(rows, vocab)
    for i in range(rows):
        for t in outputs[i]:
            counts[i, t] += 1
        seen[i, prompts[i] + outputs[i]] = True
        for t, b in params[i].logit_bias.items():
            bias[i, t] = b
    args = PenaltyArgs(
        torch.arange(rows),
        torch.arange(rows),
        torch.tensor([p.presence_penalty for p in params]),
        torch.tensor([p.frequency_penalty for p in params]),
        torch.tensor([p.repetition_penalty for p in params]),
        bias,
    )
    got = apply_penalties(logits, counts, seen, args)
    for i in range(rows):
        want = reference_penalized(logits[i].tolist(), prompts[i], outputs[i], params[i])
        assert got[i].tolist() == pytest.approx(want, abs=1e-5)


# ---------------------------------------------------------------- n choices
def test_greedy_choices_are_equal_and_share_the_prompts_pages(tiny_models):
    """n = 4, greedy: four equal choices. Choice 0 runs the prompt; the other three wait for it
    to be cached and match its 16 tokens of whole pages, running only the last one."""
    path = tiny_models["llama3"]
    llm = _llm(path)
    matched = _matched_lengths(llm)
    out = llm.generate([PROMPT], _params(n=4))[0]
    tokens = [c["token_ids"] for c in out["choices"]]
    assert len(tokens) == 4 and all(t == tokens[0] for t in tokens)
    assert out["token_ids"] == tokens[0] == _llm(path).generate([PROMPT], _params())[0]["token_ids"]
    assert matched == [0, 16, 16, 16]
    assert_pages_all_back(llm.scheduler)


def test_seeded_choices_are_their_own_and_repeat(tiny_models):
    """Seeded sampling with n = 3: the choices differ; each is choice i of the same seed from a
    fresh engine, whatever n is; choice 0 is the request with n = 1."""
    path = tiny_models["qwen3"]
    sampled = dict(temperature=1.0, seed=11, max_tokens=8)
    three = _llm(path).generate([PROMPT], _params(n=3, **sampled))[0]["choices"]
    four = _llm(path).generate([PROMPT], _params(n=4, **sampled))[0]["choices"]
    one = _llm(path).generate([PROMPT], _params(**sampled))[0]
    tokens = [c["token_ids"] for c in three]
    assert len({tuple(t) for t in tokens}) == 3
    assert tokens == [c["token_ids"] for c in four[:3]]
    assert tokens[0] == one["token_ids"]


def test_choices_with_echo_take_the_first_choices_prompt_logprobs(tiny_models):
    """n = 3 with echo: one prompt forward; every choice reports the same prompt entries."""
    path = tiny_models["llama3"]
    llm = _llm(path)
    matched = _matched_lengths(llm)
    out = llm.generate([PROMPT], _params(n=3, prompt_logprobs=0, logprobs=0, max_tokens=2))[0]
    assert matched == [0, 16, 16]
    reqs_lp = out["prompt_logprobs"]
    assert len(reqs_lp) == len(PROMPT)
    _assert_entries(reqs_lp.slice(1), _hf_logprobs(path, PROMPT), PROMPT, 1, 0)


def test_an_aborted_first_choice_lets_the_others_run(tiny_models):
    """Choice 0 aborted before its prompt ran: the held choices run without it, and every
    page comes back."""
    llm = _llm(tiny_models["llama3"])
    s = llm.scheduler
    reqs = s.add_choices(PROMPT, _params(n=3))
    s.abort(reqs[0])
    finished = s.run_until_idle()
    assert set(finished) == set(reqs[1:])
    assert all(len(r.output_ids) == 6 for r in reqs[1:])
    assert_pages_all_back(s)


def test_choices_with_the_naive_cache_still_run(tiny_models):
    llm = _llm(tiny_models["qwen2"], cache_type="naive")
    out = llm.generate([PROMPT], _params(n=2))[0]
    assert out["choices"][0]["token_ids"] == out["choices"][1]["token_ids"]


# ---------------------------------------------------------------- settings and messages
@pytest.mark.parametrize(
    "fields, name",
    [
        (dict(logprobs=21), "logprobs"),
        (dict(logprobs=-1), "logprobs"),
        (dict(logprobs=True), "logprobs"),
        (dict(prompt_logprobs=30), "prompt_logprobs"),
        (dict(n=0), "n"),
        (dict(n=129), "n"),
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-3.0), "frequency_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(logit_bias={"seven": 1.0}), "logit_bias"),
        (dict(logit_bias={3: 101.0}), "logit_bias"),
        (dict(logit_bias={-1: 1.0}), "logit_bias"),
    ],
)
def test_a_bad_value_gets_one_clear_error_naming_its_field(fields, name):
    from minisgl.core import SamplingParams

    with pytest.raises(ValueError) as e:
        SamplingParams(**fields)
    assert str(e.value).split()[0] == name


def test_the_engine_refuses_what_it_cannot_serve(tiny_models):
    """A bias on a token past the vocabulary; log-probabilities or penalties under speculative
    decoding, whose verify forward applies neither. Nothing is queued."""
    llm = _llm(tiny_models["llama3"])
    with pytest.raises(ValueError, match="logit_bias names token 450"):
        llm.generate([PROMPT], _params(logit_bias={450: 1.0}))
    spec = _llm(tiny_models["llama3"], speculative="ngram")
    for fields in (dict(logprobs=0), dict(presence_penalty=0.5)):
        with pytest.raises(ValueError, match="speculative decoding"):
            spec.generate([PROMPT], _params(**fields))
    assert spec.scheduler.idle and llm.scheduler.idle
    with pytest.raises(ValueError, match="add_choices"):
        llm.scheduler.add_req(PROMPT, _params(n=2))


def test_a_logit_bias_travels_in_a_message():
    """msgpack reads back string keys only: the token ids of a logit_bias survive the trip."""
    import msgpack

    from minisgl.core import Logprobs, SamplingParams
    from minisgl.message import BaseBackendMsg, DetokenizeMsg, UserMsg
    from minisgl.message.tokenizer import BaseTokenizerMsg

    params = SamplingParams(logit_bias={5: 1.5, 300: -100.0}, n=2, logprobs=3)
    msg = UserMsg(1, torch.tensor([1, 2], dtype=torch.int32), params)
    wire = msgpack.packb(BaseBackendMsg.encoder(msg), use_bin_type=True)
    back = BaseBackendMsg.decoder(msgpack.unpackb(wire, raw=False))
    assert back.sampling_params == params
    lp = Logprobs([7], [-0.5], [[7, 9]], [[-0.5, -1.25]])
    detok = DetokenizeMsg(1, 7, False, index=1, logprobs=lp)
    wire = msgpack.packb(BaseTokenizerMsg.encoder(detok), use_bin_type=True)
    assert BaseTokenizerMsg.decoder(msgpack.unpackb(wire, raw=False)) == detok


def test_token_bytes_rebuild_text_whose_tokens_split_characters(tiny_models):
    """Byte-level tokens of accented, CJK and emoji text: some decode alone to U+FFFD, yet the
    bytes of all the tokens, joined, are the text's UTF-8."""
    import tiny_models as tm
    from helpers import hf_tokenizer

    from minisgl.tokenizer.token_bytes import TokenBytes

    tokenizer = hf_tokenizer(tiny_models["qwen2bytes"])
    ids = tokenizer.encode(tm.MULTIBYTE_TEXT)
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)  # the case that matters
    assert b"".join(TokenBytes(tokenizer)(ids)) == tm.MULTIBYTE_TEXT.encode()


def test_openai_shapes_of_logprobs():
    """The legacy completions shape: offsets into the text, the sampled token always among the
    alternatives, None for a prompt's first token; the chat shape: one object a token with
    exact bytes, a partial character among them."""
    from minisgl.message.frontend import TextLogprobs
    from minisgl.server.logprobs import chat_logprobs, completion_logprobs

    lp = TextLogprobs(
        [1, 2, 3],
        [None, -0.5, -2.0],
        [[], [2, 4], [5]],
        [[], [-0.5, -1.0], [-0.1]],
        [b"Hi", b" caf", b"\xc3"],
        [[], [b" caf", b" the"], [b"!"]],
    )
    legacy = completion_logprobs(lp, start=10)
    assert legacy == {
        "tokens": ["Hi", " caf", "\ufffd"],
        "token_logprobs": [None, -0.5, -2.0],
        "top_logprobs": [None, {" caf": -0.5, " the": -1.0}, {"!": -0.1, "\ufffd": -2.0}],
        "text_offset": [10, 12, 16],
    }
    content = chat_logprobs(lp)["content"]
    assert content[2] == {
        "token": "\ufffd",
        "logprob": -2.0,
        "bytes": [0xC3],
        "top_logprobs": [{"token": "!", "logprob": -0.1, "bytes": [33]}],
    }
