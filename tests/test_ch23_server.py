"""Chapter 23 through the server: OpenAI's ``response_format`` (a Pydantic model's schema by the
official client, and json_object) and SGLang's ``regex`` and ``ebnf`` fields, streamed or not;
a constraint that cannot be compiled gets a 400 with xgrammar's message, and the server goes on."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

from test_ch13_server import KEY, MODEL, Server  # noqa: E402 (the real process, as chapter 13 runs it)

DATE = r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]"
CHAT = [{"role": "user", "content": "Who are you?"}]


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(pattern=r"^[A-Za-z ]{1,8}$")  # not max_length: see test_ch23
    age: int = pydantic.Field(ge=0, le=120)
    ok: bool


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    srv = Server(
        tiny_models["qwen2bytes"],
        tmp_path_factory.mktemp("server") / "server.log",
        "--api-key",
        KEY,
    )
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log.read_text(), srv.log.read_text()


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_a_pydantic_models_schema_gives_json_it_validates(server, seed):
    completion = server.client().chat.completions.parse(
        model=MODEL,
        messages=CHAT,
        response_format=Person,
        max_tokens=200,
        seed=seed,
        temperature=0 if seed is None else 1.0,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert Person.model_validate_json(choice.message.content) == choice.message.parsed


def test_regex_and_ebnf_fields_on_completions_streamed_or_not(server):
    client = server.client()
    plain = client.completions.create(
        model=MODEL, prompt="Today is", max_tokens=40, temperature=0, extra_body={"regex": DATE}
    )
    assert re.fullmatch(DATE, plain.choices[0].text)
    assert plain.choices[0].finish_reason == "stop"
    stream = client.completions.create(
        model=MODEL,
        prompt="Today is",
        max_tokens=40,
        temperature=0,
        extra_body={"regex": DATE},
        stream=True,
    )
    assert "".join(chunk.choices[0].text for chunk in stream) == plain.choices[0].text
    ebnf = 'root ::= ("yes" | "no") "."'
    reply = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=20, extra_body={"ebnf": ebnf}
    )
    assert reply.choices[0].message.content in ("yes.", "no.")


def test_json_object_gives_a_json_object(server):
    reply = server.client().chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=300,
        temperature=0,
        response_format={"type": "json_object"},
    )
    choice = reply.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:  # an object of any size may outrun max_tokens; what came is its beginning
        assert choice.finish_reason == "length" and choice.message.content.startswith("{")


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nope"}},
                }
            },
            "json_schema cannot be compiled",
        ),
        ({"regex": "(ab"}, "regex cannot be compiled"),
        ({"ebnf": 'start ::= "a"'}, "ebnf cannot be compiled"),
        ({"regex": "[^\\s\\S]"}, "regex accepts no text"),
        ({"response_format": {"type": "xml"}}, "response_format.type='xml'"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema.schema"),
        ({"regex": "a", "ebnf": 'root ::= "a"'}, "at most one of response_format, regex, ebnf"),
    ],
)
def test_a_bad_constraint_gets_a_400_and_the_server_goes_on(server, extra, message):
    client = server.client()
    with pytest.raises(openai.BadRequestError, match=re.escape(message)):
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, extra_body=extra)
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5)
    assert reply.choices[0].finish_reason in ("stop", "length")
