"""Chapter 24 through the server: ``--speculative ngram`` gives greedy's text, stop strings cut
it where they occur even when a run of several tokens carries them, ``usage`` counts the tokens
returned, and streaming gives the same text."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from helpers import hf_tokenizer  # noqa: E402
from test_ch13_server import KEY, Server  # noqa: E402 (the real process, as chapter 13 runs it)

PROMPTS = [
    "a b c d a b c d a b c d the quick brown fox the quick brown fox",
    "hello world hello world hello",
]
MAX_TOKENS = 40
MODEL = "llama3"  # the served model's name: its folder's, unless --served-model-name


@pytest.fixture(scope="module")
def model(tiny_models):
    return tiny_models["llama3"]


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    srv = Server(
        model,
        tmp_path_factory.mktemp("server") / "server.log",
        "--api-key",
        KEY,
        "--speculative",
        "ngram",
        "--speculative-k",
        "5",
    )
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log.read_text(), srv.log.read_text()


@pytest.fixture(scope="module")
def offline(model):
    """Greedy without speculation, EOS ending a row as the server's does."""
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    llm = LLM(str(model), device="cpu", page_size=4, num_pages=256)
    return llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))


def _complete(server, prompt: str, **options):
    return server.client().completions.create(
        model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, **options
    )


@pytest.mark.parametrize("row", [0, 1])
def test_greedy_text_and_usage_are_those_without_speculation(server, offline, row):
    reply = _complete(server, PROMPTS[row])
    expected = offline[row]
    assert reply.choices[0].text == expected["text"]
    assert reply.usage.completion_tokens == len(expected["token_ids"])
    assert reply.usage.prompt_tokens == len(expected["prompt_token_ids"])
    reason = "length" if len(expected["token_ids"]) == MAX_TOKENS else "stop"
    assert reply.choices[0].finish_reason == reason


@pytest.mark.parametrize("row", [0, 1])
def test_a_stop_string_cuts_the_text_and_usage_counts_the_tokens_returned(
    server, model, offline, row
):
    """The stop string from the middle of greedy's text: the reply ends before it, and usage
    counts the tokens up to the one whose text completed it, streamed or not."""
    tokenizer = hf_tokenizer(model)
    ids, full = offline[row]["token_ids"], offline[row]["text"]
    assert len(full) >= 12, full
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    cut = full.index(stop)
    through = next(m for m in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:m]))
    reply = _complete(server, PROMPTS[row], stop=[stop])
    assert reply.choices[0].text == full[:cut]
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == through
    chunks = list(
        _complete(
            server, PROMPTS[row], stop=[stop], stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full[:cut]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == through


def test_a_stream_without_stop_gives_the_whole_text(server, offline):
    stream = _complete(server, PROMPTS[0], stream=True)
    assert "".join(chunk.choices[0].text for chunk in stream) == offline[0]["text"]
