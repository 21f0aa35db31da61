"""Chapter 25's server driven by two tools through their own released packages, on the real
SmolLM2-135M-Instruct (chapter 13's ``Server``, one process for the module):

- guidance: its OpenAI model for ``gen`` (streamed, with logprobs and the top 5), and its client
  for SGLang's dialect for ``select`` (a grammar sent in ``ebnf`` as llguidance's Lark, which
  the server translates) and ``gen(regex=...)`` (sent in ``regex``). guidance's OpenAI model
  refuses those two itself, before any request.
- LangChain's ``ChatOpenAI``: ``bind_tools`` with a named tool and with "required", the call's
  arguments validated, its result sent back as a ``ToolMessage`` (an assistant turn with null
  content and a ``tool`` turn) and a plain answer; ``with_structured_output`` by function
  calling; a streamed call whose chunks merge into the call the whole reply gives.

What each tool sends is recorded by an ``httpx`` event hook on the client it builds, so each
test also says which fields of the request the server had to read."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import pytest

for _package in ("zmq", "msgpack", "fastapi", "uvicorn", "openai", "httpx", "xgrammar"):
    pytest.importorskip(_package)

import httpx  # noqa: E402
import openai  # noqa: E402
import pydantic  # noqa: E402
from test_ch13_server import KEY, Server  # noqa: E402 (the real process, as ch13 runs it)

NAME = "smol"  # the served model's name
ASK = "What will the weather be in Paris for the next 3 days?"
INSTALL = "pip install -e '.[tools]'"  # guidance and langchain-openai, at the tested versions


class Weather(pydantic.BaseModel):
    """Short values, bounded by the schema, so that a call ends within max_tokens."""

    city: str = pydantic.Field(pattern=r"^[A-Za-z]{1,12}$")
    days: int = pydantic.Field(ge=1, le=7)


class Clock(pydantic.BaseModel):
    zone: str = pydantic.Field(pattern=r"^(UTC|CET)$")


class City(pydantic.BaseModel):
    """A city and the country it is in."""

    name: str = pydantic.Field(pattern=r"^[A-Za-z]{1,12}$")
    country: str = pydantic.Field(pattern=r"^[A-Za-z]{1,12}$")


class Recorder:
    """The JSON bodies a tool posts, read by an event hook on the ``httpx`` client it is given."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    def client(self) -> httpx.Client:
        return httpx.Client(event_hooks={"request": [self._record]}, timeout=60)

    def _record(self, request: httpx.Request) -> None:
        self.bodies.append(json.loads(request.content))


@pytest.fixture(scope="module")
def server(real_model, tmp_path_factory):
    srv = Server(
        real_model,
        tmp_path_factory.mktemp("server") / "server.log",
        "--api-key",
        KEY,
        "--served-model-name",
        NAME,
    )
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log.read_text(), srv.log.read_text()


# ---------------------------------------------------------------- guidance
@pytest.fixture(scope="module")
def guidance():
    return pytest.importorskip("guidance", reason=f"guidance is not installed: {INSTALL}")


@pytest.fixture
def sglang_model(guidance, server, monkeypatch):
    """guidance's client for SGLang's server, and what it sends. It builds its ``openai`` client
    itself and passes no keyword to it but the URL and key, so the recording client is given
    through ``openai.OpenAI``, which it calls."""
    recorder = Recorder()
    recording = functools.partial(openai.OpenAI, http_client=recorder.client())
    monkeypatch.setattr(openai, "OpenAI", recording)
    model = guidance.models.experimental.SglangModel(
        NAME, base_url=server.url + "/v1", api_key=KEY, echo=False
    )
    return model, recorder


def _asked(guidance: Any, model: Any, question: str, program: Any) -> Any:
    with guidance.user():
        model += question
    with guidance.assistant():
        model += program
    return model


def test_guidance_gen_streams_with_logprobs_through_its_openai_model(guidance, server):
    """gen asks a streamed chat with logprobs and the 5 likeliest tokens (guidance reads them
    as each token's probability); select and regex its OpenAI model refuses itself, so that
    nothing reaches the server."""
    recorder = Recorder()
    model = guidance.models.OpenAI(
        NAME, base_url=server.url + "/v1", api_key=KEY, echo=False, http_client=recorder.client()
    )
    out = _asked(guidance, model, "Say hello.", guidance.gen("reply", max_tokens=6))
    print(f"guidance gen through its OpenAI model: {out['reply']!r}")
    assert isinstance(out["reply"], str) and out["reply"].strip()
    [body] = recorder.bodies
    assert body["stream"] and body["logprobs"] and body["top_logprobs"] == 5
    assert body["max_completion_tokens"] == 6
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Say hello."}]}
    ]
    with pytest.raises(ValueError, match="does not support SelectNode"):
        _asked(guidance, model, "Yes or no?", guidance.select(["yes", "no"], name="x"))
    with pytest.raises(ValueError, match="Regex not yet supported"):
        _asked(guidance, model, "A number?", guidance.gen("x", regex="[0-9]+"))
    assert len(recorder.bodies) == 1


def test_guidance_select_sends_lark_that_the_server_holds(guidance, sglang_model):
    model, recorder = sglang_model
    options = ["yes", "no", "it depends"]
    out = _asked(
        guidance, model, "Is the sky blue? Answer yes or no.", guidance.select(options, name="x")
    )
    print(f"guidance select: {out['x']!r}")
    assert out["x"] in options
    [body] = recorder.bodies
    assert body["ebnf"].startswith("%llguidance {}") and '"it depends"' in body["ebnf"]
    assert body["logprobs"] and body["top_logprobs"] == 5


def test_guidance_gen_with_a_regex_gives_text_the_regex_matches(guidance, sglang_model):
    model, recorder = sglang_model
    pattern = r"[A-Z][a-z]{1,12}, [0-9]{3,4}"
    out = _asked(
        guidance,
        model,
        "Name a city and the year it was founded.",
        guidance.gen("x", regex=pattern),
    )
    print(f"guidance gen(regex={pattern!r}): {out['x']!r}")
    assert re.fullmatch(pattern, out["x"]), out["x"]
    [body] = recorder.bodies
    assert body["regex"] == pattern


# ---------------------------------------------------------------- LangChain
@pytest.fixture(scope="module")
def lc():
    return pytest.importorskip(
        "langchain_openai", reason=f"langchain-openai is not installed: {INSTALL}"
    )


def _chat(lc: Any, server: Server, recorder: Recorder) -> Any:
    return lc.ChatOpenAI(
        model=NAME,
        base_url=server.url + "/v1",
        api_key=KEY,
        temperature=0,
        max_tokens=60,
        max_retries=0,
        http_client=recorder.client(),
    )


def _tools() -> tuple[Any, Any]:
    from langchain_core.tools import tool

    @tool(args_schema=Weather)
    def get_weather(city: str, days: int) -> str:
        """The weather forecast for a city, for a number of days."""
        return f"Sunny in {city} for {days} days, 21 C"

    @tool(args_schema=Clock)
    def now(zone: str) -> str:
        """The time in a zone."""
        return f"12:00 {zone}"

    return get_weather, now


def test_langchain_binds_a_named_tool_and_round_trips_its_result(lc, server, real_model):
    """The call comes back in tool_calls with arguments the tool's schema takes; its result goes
    back as a ToolMessage, after the assistant's turn with null content; the server renders
    exactly that conversation, and the reply to it is a plain answer."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from transformers import AutoTokenizer

    from minisgl.function_call import ToolTemplate
    from minisgl.server.protocol import messages_of

    recorder = Recorder()
    get_weather, _ = _tools()
    chat = _chat(lc, server, recorder)
    ask = HumanMessage(ASK)
    called = chat.bind_tools([get_weather], tool_choice="get_weather").invoke([ask])
    [call] = called.tool_calls
    print(f"LangChain bind_tools: {call['name']}({call['args']})")
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    Weather(**call["args"])  # raises unless the arguments fit the schema
    assert called.response_metadata["finish_reason"] == "tool_calls" and called.content == ""
    result = get_weather.invoke(call)
    assert isinstance(result, ToolMessage) and result.tool_call_id == call["id"]

    final = chat.bind_tools([get_weather]).invoke([ask, called, result])
    print(f"LangChain's answer after the tool's result: {final.content!r}")
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert isinstance(final.content, str) and final.content.strip()
    sent = recorder.bodies[-1]
    assert sent["messages"][1]["content"] is None and sent["messages"][1]["tool_calls"]
    assert sent["messages"][2] == {
        "role": "tool",
        "content": result.content,
        "tool_call_id": call["id"],
    }
    # SmolLM2's template ignores tools: the server wrote them, the call and the result in
    template = ToolTemplate.of(AutoTokenizer.from_pretrained(str(real_model)))
    expected = template.prompt_ids(messages_of(sent["messages"]), sent["tools"])
    assert final.usage_metadata["input_tokens"] == len(expected)
    assert result.content in template.tokenizer.decode(expected)


def test_langchain_required_calls_one_of_two_tools_with_valid_arguments(lc, server):
    get_weather, now = _tools()
    recorder = Recorder()
    called = (
        _chat(lc, server, recorder)
        .bind_tools([get_weather, now], tool_choice="required")
        .invoke(ASK)
    )
    [call] = called.tool_calls
    print(f"LangChain tool_choice='required': {call['name']}({call['args']})")
    schema = {"get_weather": Weather, "now": Clock}[call["name"]]
    schema(**call["args"])
    assert recorder.bodies[0]["tool_choice"] == "required"


def test_langchain_structured_output_by_function_calling(lc, server):
    recorder = Recorder()
    chat = _chat(lc, server, recorder)
    city = chat.with_structured_output(City, method="function_calling").invoke(
        "Name the capital of France."
    )
    print(f"LangChain with_structured_output: {city!r}")
    assert isinstance(city, City)  # validated by pydantic
    assert recorder.bodies[0]["tool_choice"] == {"type": "function", "function": {"name": "City"}}


def test_langchain_streams_a_tool_call_whose_chunks_merge_into_the_whole_replys(lc, server):
    get_weather, _ = _tools()
    bound = _chat(lc, server, Recorder()).bind_tools([get_weather], tool_choice="get_weather")
    whole = bound.invoke(ASK).tool_calls[0]
    chunks = list(bound.stream(ASK))
    pieces = [c for chunk in chunks for c in chunk.tool_call_chunks]
    assert pieces and pieces[0]["name"] == "get_weather" and pieces[0]["id"].startswith("call_")
    merged = functools.reduce(lambda a, b: a + b, chunks)
    [call] = merged.tool_calls
    assert (call["name"], call["args"]) == (whole["name"], whole["args"])
    Weather(**call["args"])
