"""Chapter 25 through the server: log-probabilities on both endpoints (the prompt's too, with
``echo``: lm-evaluation-harness's loglikelihood request), ``n`` choices, penalties and
``logit_bias``, each with a batch of prompts, streamed or not, asked with the official ``openai``
client. The log-probabilities are held against transformers' log-softmax on the same weights in
float32; the rest against the same request made another way (alone, not streamed)."""

from __future__ import annotations

import math

import pytest

for _package in ("zmq", "msgpack", "fastapi", "uvicorn", "openai", "httpx"):
    pytest.importorskip(_package)

import openai  # noqa: E402
import torch  # noqa: E402
from test_ch13_server import KEY, Server  # noqa: E402 (the real process, as ch13 runs it)

NAME = "tiny"
PROMPTS = ["Hello world", "Once upon a time"]
CHAT = [{"role": "user", "content": "What is the weather today?"}]
TOLERANCE = 1e-4  # float32 log-softmax, another order of additions


@pytest.fixture(scope="module")
def model(tiny_models):
    return tiny_models["qwen3"]


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    srv = Server(
        model,
        tmp_path_factory.mktemp("server") / "server.log",
        "--api-key",
        KEY,
        "--served-model-name",
        NAME,
    )
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log.read_text(), srv.log.read_text()


@pytest.fixture(scope="module")
def hf(model):
    """transformers' model and tokenizer on the same files, in float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (
        AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval(),
        AutoTokenizer.from_pretrained(str(model)),
    )


def _hf_logprobs(hf, ids: list) -> torch.Tensor:
    """Row i: the log-probabilities of the token after ids[: i + 1]."""
    with torch.inference_mode():
        logits = hf[0](torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def _greedy(max_tokens: int, **more) -> dict:
    return {"max_tokens": max_tokens, "temperature": 0, **more}


def test_echo_scores_every_prompt_token_as_transformers_does(server, hf):
    """lm-eval's loglikelihood request, on a batch of two prompts: each prompt's tokens, the
    first with no log-probability, the others transformers' log-softmax of the token before."""
    client = server.client()
    reply = client.completions.create(
        model=NAME, prompt=PROMPTS, max_tokens=0, logprobs=1, echo=True, temperature=0
    )
    assert [c.index for c in reply.choices] == [0, 1]
    for prompt, choice in zip(PROMPTS, reply.choices):
        ids = hf[1](prompt)["input_ids"]
        lp = choice.logprobs
        assert choice.text == prompt and "".join(lp.tokens) == prompt
        assert len(lp.token_logprobs) == len(ids) and lp.token_logprobs[0] is None
        ref = _hf_logprobs(hf, ids)
        for i in range(1, len(ids)):
            assert math.isclose(lp.token_logprobs[i], ref[i - 1, ids[i]], abs_tol=TOLERANCE)
            best = ref[i - 1].argmax().item()
            top = lp.top_logprobs[i]  # the most likely token, and the prompt's own
            assert hf[1].decode([best]) in top and len(top) <= 2
        assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(ids))]


def test_sampled_tokens_logprobs_on_both_endpoints_streamed_or_not(server, hf):
    """Each generated token's log-probability and its top 3, as transformers gives them after
    the prompt and the tokens before it; the stream carries the same numbers (to float32's
    rounding)."""
    client = server.client()
    whole = client.completions.create(
        model=NAME, prompt=PROMPTS[0], logprobs=3, **_greedy(6)
    ).choices[0]
    ids = hf[1](PROMPTS[0])["input_ids"]
    with torch.inference_mode():
        out = hf[0].generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)
    out = out[0, len(ids) :].tolist()
    assert hf[1].decode(out) == whole.text and len(whole.logprobs.tokens) == len(out)
    ref = _hf_logprobs(hf, ids + out)
    for i, (token, value) in enumerate(zip(out, whole.logprobs.token_logprobs)):
        row = ref[len(ids) - 1 + i]
        assert token == row.argmax().item()  # greedy
        assert math.isclose(value, row[token], abs_tol=TOLERANCE)
        top = sorted(whole.logprobs.top_logprobs[i].values(), reverse=True)
        assert torch.allclose(torch.tensor(top), row.topk(3).values, atol=TOLERANCE)
    stream = client.completions.create(
        model=NAME, prompt=PROMPTS[0], logprobs=3, stream=True, **_greedy(6)
    )
    streamed = [v for chunk in stream for v in (chunk.choices[0].logprobs or {}).token_logprobs]
    # a second request reuses the prompt's cached pages: its prefill adds in another order
    assert torch.allclose(torch.tensor(streamed), torch.tensor(whole.logprobs.token_logprobs))

    chat = client.chat.completions.create(
        model=NAME, messages=CHAT, logprobs=True, top_logprobs=2, **_greedy(5)
    ).choices[0]
    content = chat.logprobs.content
    assert "".join(t.token for t in content) == chat.message.content
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob == t.logprob for t in content)
    stream = client.chat.completions.create(
        model=NAME, messages=CHAT, logprobs=True, top_logprobs=2, stream=True, **_greedy(5)
    )
    streamed = [
        t.logprob for c in stream if c.choices[0].logprobs for t in c.choices[0].logprobs.content
    ]
    assert torch.allclose(torch.tensor(streamed), torch.tensor([t.logprob for t in content]))


def test_no_logprobs_asked_none_given(server):
    client = server.client()
    reply = client.completions.create(model=NAME, prompt=PROMPTS[0], **_greedy(3))
    assert reply.choices[0].logprobs is None
    chat = client.chat.completions.create(model=NAME, messages=CHAT, **_greedy(3))
    assert chat.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs"):
        client.chat.completions.create(model=NAME, messages=CHAT, top_logprobs=2, **_greedy(3))


def test_n_choices_for_each_prompt_of_a_batch_in_order(server):
    """Two prompts, three seeded choices each: indices 0-5, the prompt's choices together, each
    equal to the same prompt and seed asked alone with n=1; streamed, the same texts."""
    client = server.client()
    sampled = {"max_tokens": 6, "temperature": 1.0, "seed": 7}
    batch = client.completions.create(model=NAME, prompt=PROMPTS, n=3, **sampled)
    assert [c.index for c in batch.choices] == list(range(6))
    for p, prompt in enumerate(PROMPTS):
        alone = client.completions.create(model=NAME, prompt=prompt, n=3, **sampled)
        assert [c.text for c in alone.choices] == [c.text for c in batch.choices[3 * p : 3 * p + 3]]
    assert len({c.text for c in batch.choices[:3]}) > 1  # choices of one prompt differ
    assert batch.usage.completion_tokens == 36
    stream = client.completions.create(model=NAME, prompt=PROMPTS, n=3, stream=True, **sampled)
    texts = [""] * 6
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in batch.choices]
    chat = client.chat.completions.create(model=NAME, messages=CHAT, n=2, **_greedy(4))
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.choices[0].message.content == chat.choices[1].message.content  # greedy


def test_logit_bias_and_penalties_change_the_reply(server, hf):
    client = server.client()
    token = hf[1](" time")["input_ids"][-1]
    forced = client.completions.create(
        model=NAME, prompt=PROMPTS, logit_bias={str(token): 100}, **_greedy(4)
    )
    for choice in forced.choices:
        assert choice.text == hf[1].decode([token] * 4)
    plain = client.completions.create(model=NAME, prompt=PROMPTS[1], **_greedy(24)).choices[0]
    penalised = client.completions.create(
        model=NAME, prompt=PROMPTS[1], frequency_penalty=2.0, presence_penalty=1.0, **_greedy(24)
    ).choices[0]
    assert penalised.text != plain.text
    ids = hf[1](penalised.text)["input_ids"]
    assert len(set(ids)) >= len(set(hf[1](plain.text)["input_ids"]))  # fewer repeats


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"n": 0}, "n"),
        ({"logprobs": 21}, "logprobs"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
    ],
)
def test_a_value_out_of_range_gets_a_400_naming_it(server, extra, words):
    client = server.client()
    with pytest.raises(openai.BadRequestError, match=words):
        client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=2, extra_body=extra)
    assert client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=2).choices
