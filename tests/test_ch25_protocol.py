"""Chapter 25, the protocol: requests in the shapes the tools send (a batch of prompts, content as
text parts), the facts a client reads from the server (its model's name, the context it takes, a
404 for a model it does not serve), SGLang's native ``/generate``, and tool calls: the families'
syntaxes parsed, whole and streamed; tools rendered through the chat template; ``tool_choice``
"required" or named held by a grammar, so that even a random model calls validly; guidance's
grammars in llguidance's Lark syntax, translated into GBNF where the translation is exact.

The parsers are driven with model-shaped text; the server is the real one (chapter 13's
``Server``) on a tiny Qwen2 whose template is Qwen2.5's, asked with the official ``openai`` client
and, where it is installed, with LangChain."""

from __future__ import annotations

import json
import random
import re

import pytest

for _package in ("zmq", "msgpack", "fastapi", "uvicorn", "openai", "httpx"):
    pytest.importorskip(_package)

import httpx  # noqa: E402
import openai  # noqa: E402
from test_ch13_server import KEY, PAGES, Server  # noqa: E402 (the real process, as ch13 runs it)

from minisgl.function_call import (  # noqa: E402
    HERMES,
    LLAMA3_JSON,
    ToolCallStream,
    ToolTemplate,
    tool_call_grammar,
)
from minisgl.server.protocol import RequestError, messages_of, prompts_of  # noqa: E402
from minisgl.server.tool_calls import tools_of  # noqa: E402

NAME = "tiny-qwen"  # the module server's --served-model-name
CONTEXT = 4096
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "pattern": "^[A-Za-z]{1,8}$"},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}
CLOCK = {
    "name": "now",
    "description": "The time",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"enum": ["UTC", "CET"]}},
        "required": ["zone"],
        "additionalProperties": False,
    },
}
TOOLS = [{"type": "function", "function": f} for f in (WEATHER, CLOCK)]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

# Qwen2.5-Instruct's chat template, as its tokenizer_config.json ships it (four long lines broken
# inside their tags, which renders the same): tools in the system turn, calls in <tool_call>
# tags, results in <tool_response> tags of a user turn
QWEN25_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        ~ "You are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and "
        ~ "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
        ~ "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. '
            ~ 'You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first)
        or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


def _tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def qwen25(tiny_models, tmp_path_factory):
    """The tiny byte-level Qwen2 with Qwen2.5-Instruct's chat template, and a context of 4,096
    tokens: two tools in Qwen2.5's words take about 600 of its byte-level tokens."""
    import shutil

    path = tmp_path_factory.mktemp("qwen25") / "qwen25-tools"
    shutil.copytree(tiny_models["qwen2bytes"], path)
    (path / "chat_template.jinja").write_text(QWEN25_TEMPLATE)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": CONTEXT}))
    return path


@pytest.fixture(scope="module")
def server(qwen25, tmp_path_factory):
    srv = Server(
        qwen25,
        tmp_path_factory.mktemp("server") / "server.log",
        "--api-key",
        KEY,
        "--served-model-name",
        NAME,
    )
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log.read_text(), srv.log.read_text()


def _post(server, route, body) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEY}"}
    return httpx.post(server.url + route, json=body, headers=headers, timeout=30)


def _greedy(n: int) -> dict:
    return dict(max_tokens=n, temperature=0, extra_body={"ignore_eos": True})


# ---------------------------------------------------------------- the parsers, on model text
HERMES_REPLIES = [
    # (the model's text, the content a client sees, the calls as (name, arguments))
    ("Hello there.", "Hello there.", []),
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
        "</tool_call>",
        "",
        [("get_weather", {"city": "Paris", "days": 2})],
    ),
    (
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", '
        '"days": 1}}\n</tool_call>\n<tool_call>\n{"name": "now", "arguments": {"zone": "UTC"}}'
        "\n</tool_call>",
        "Let me look.",
        [("get_weather", {"city": "Oslo", "days": 1}), ("now", {"zone": "UTC"})],
    ),
    # a function that is not among the tools, and JSON that does not parse: the model's text
    (
        '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>',
        [],
    ),
    ("<tool_call>\n{oops\n</tool_call> done", "<tool_call>\n{oops\n</tool_call> done", []),
    # cut by max_tokens before the closing tag: a whole JSON is still a call
    ('<tool_call>\n{"name": "now", "arguments": {"zone": "CET"}}', "", [("now", {"zone": "CET"})]),
    ("a < b <tool but no call", "a < b <tool but no call", []),
]
LLAMA_REPLIES = [
    ('{"name": "now", "parameters": {"zone": "UTC"}}', "", [("now", {"zone": "UTC"})]),
    (
        ' {"name": "now", "parameters": {"zone": "UTC"}}; {"name": "get_weather", "parameters": '
        '{"city": "Rome", "days": 3}}',
        "",
        [("now", {"zone": "UTC"}), ("get_weather", {"city": "Rome", "days": 3})],
    ),
    ("The time is noon.", "The time is noon.", []),
    ('{"name": "now", "parameters": 5}', '{"name": "now", "parameters": 5}', []),
    ('{"answer": 42}', '{"answer": 42}', []),
]
NAMES = [WEATHER["name"], CLOCK["name"]]


def _calls(calls) -> list:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize(
    "fmt, text, content, calls",
    [(HERMES, *r) for r in HERMES_REPLIES] + [(LLAMA3_JSON, *r) for r in LLAMA_REPLIES],
)
def test_a_whole_reply_parses_into_content_and_calls(fmt, text, content, calls):
    got_content, got_calls = fmt.parse(text, NAMES)
    assert (got_content, _calls(got_calls)) == (content, calls)


@pytest.mark.parametrize(
    "fmt, text, content, calls",
    [(HERMES, *r) for r in HERMES_REPLIES] + [(LLAMA3_JSON, *r) for r in LLAMA_REPLIES],
)
def test_a_streamed_reply_gives_the_whole_replys_parse_however_it_is_cut(fmt, text, content, calls):
    """Cut into pieces of 1 to 7 characters, ten ways: the text events join to the content, the
    calls come whole, and no text event ever shows a piece of a call's markup."""
    rng = random.Random(0)
    for _ in range(10):
        stream, events, i = ToolCallStream(fmt, NAMES), [], 0
        while i < len(text):
            n = rng.randint(1, 7)
            events += stream.feed(text[i : i + n])
            i += n
        events += stream.finish()
        texts = [e for kind, e in events if kind == "text"]
        assert "".join(texts) == content
        assert _calls(e for kind, e in events if kind == "call") == calls
        if calls:
            assert not any("<tool_call" in t or '"name"' in t for t in texts)


def test_text_is_given_out_as_it_comes_unless_it_may_begin_a_call():
    stream = ToolCallStream(HERMES, NAMES)
    assert stream.feed("Hello ") == [("text", "Hello")]  # the space waits for what follows
    assert stream.feed("world <to") == [("text", " world")]  # "<to" may begin <tool_call>
    assert stream.feed("day") == [("text", " <today")]
    assert stream.finish() == []


# ---------------------------------------------------------------- request shapes, in process
@pytest.mark.parametrize(
    "prompt, expected",
    [
        ("Hi", ["Hi"]),
        ([5, 6], [[5, 6]]),
        (["Hi", "Yo"], ["Hi", "Yo"]),
        ([[5], [6, 7]], [[5], [6, 7]]),
    ],
)
def test_a_prompt_is_a_batch_of_one_or_more(prompt, expected):
    assert prompts_of(prompt) == expected


@pytest.mark.parametrize(
    "prompt, words",
    [
        ([1, 2.5], "a list holding 2.5"),
        (["Hi", 3], "mixes strings, token ids and lists"),
        ({"text": "Hi"}, "dict"),
        ([], "prompt is empty"),
        (["Hi", ""], "prompt[1] is empty"),
        ([[1], []], "prompt[1] is empty"),
    ],
)
def test_a_prompt_of_another_shape_is_refused_naming_the_shapes_it_may_have(prompt, words):
    with pytest.raises(RequestError) as refused:
        prompts_of(prompt)
    assert words in str(refused.value) and refused.value.param == "prompt"
    assert ".str" not in str(refused.value)  # not pydantic's guess at one member of a union


def test_message_contents_as_text_parts_and_tool_turns_become_what_templates_read():
    messages = messages_of(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "now", "arguments": '{"zone": "UTC"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "12:00"}]},
        ]
    )
    assert messages[0] == {"role": "user", "content": "a\nb"}
    assert messages[1]["content"] == ""
    assert messages[1]["tool_calls"][0]["function"] == {"name": "now", "arguments": {"zone": "UTC"}}
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "12:00"}


@pytest.mark.parametrize(
    "messages, words",
    [
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "messages[0].content[0]: a part of type 'image_url'",
        ),
        ([{"role": "user"}], "messages[0].content: required"),
        ([{"role": "user", "content": 5}], "messages[0].content: a string or a list"),
        (
            [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}],
                }
            ],
            "messages[0].tool_calls[0].function.arguments: not JSON",
        ),
    ],
)
def test_a_message_the_engine_cannot_read_is_refused_naming_where(messages, words):
    with pytest.raises(RequestError, match=re.escape(words)):
        messages_of(messages)


@pytest.mark.parametrize(
    "tools, choice, words",
    [
        ([{"type": "function"}], None, "tools[0]: a tool is"),
        ([{"type": "function", "function": {"name": "a b"}}], None, "tools[0].function.name"),
        (TOOLS + TOOLS[:1], None, "two functions share a name"),
        (TOOLS, {"type": "function", "function": {"name": "fly"}}, "names 'fly', which is not"),
        (TOOLS, "always", "tool_choice: 'none', 'auto', 'required'"),
        (None, "required", "needs tools"),
    ],
)
def test_bad_tools_or_tool_choice_are_refused_naming_them(tools, choice, words):
    with pytest.raises(RequestError, match=re.escape(words)):
        tools_of(tools, choice)


def test_tool_choice_decides_what_is_shown_and_what_is_forced():
    assert tools_of(TOOLS, "none") is None and tools_of(None, None) is None
    auto = tools_of(TOOLS, None)
    assert auto.forced is None and auto.tools == TOOLS
    required = tools_of(TOOLS, "required")
    assert required.forced == [WEATHER, CLOCK] and required.tools == TOOLS
    named = tools_of(TOOLS, {"type": "function", "function": {"name": "now"}})
    assert named.forced == [CLOCK] and named.tools == TOOLS[1:]


# ---------------------------------------------------------------- templates
def test_qwen25s_template_renders_tools_and_tool_turns_itself(qwen25):
    template = ToolTemplate.of(_tokenizer(qwen25))
    assert template.native and template.format is HERMES
    chat = ASK + [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "now", "arguments": {"zone": "UTC"}}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
    ]
    text = template.tokenizer.decode(template.prompt_ids(chat, TOOLS))
    assert "<tools>\n" + json.dumps(TOOLS[0]) in text
    assert '<tool_call>\n{"name": "now", "arguments": {"zone": "UTC"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n12:00\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_a_template_that_ignores_tools_gets_them_written_by_the_server(tiny_models, qwen25):
    """The tiny models' template, like SmolLM2's, renders no tools: the server writes them in
    the hermes format, and the prompt then differs from Qwen2.5's own only in its system line."""
    plain = ToolTemplate.of(_tokenizer(tiny_models["qwen2bytes"]))
    assert not plain.native and plain.format is HERMES
    chat = ASK + [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "now", "arguments": {"zone": "UTC"}}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
    ]
    written = plain.tokenizer.decode(plain.prompt_ids(chat, TOOLS))
    native = ToolTemplate.of(_tokenizer(qwen25))
    own = native.tokenizer.decode(native.prompt_ids(chat, TOOLS))
    intro = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n"
    assert written == own.replace(intro, "")


def test_tools_written_out_teach_the_syntax_their_parser_reads():
    """A template that ignores tools gets them in the system turn with the instructions of the
    format the server parses: Qwen2.5's ``<tool_call>`` tags for hermes, Llama 3.1's bare JSON
    with "parameters" for llama3_json; an earlier call is written in the same syntax."""
    from minisgl.function_call.template import written_out

    call = {"function": {"name": "now", "arguments": {"zone": "UTC"}}}
    chat = [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "12:00"},
    ]
    tools = [{"type": "function", "function": CLOCK}]
    hermes, llama = (written_out(chat, tools, fmt) for fmt in (HERMES, LLAMA3_JSON))
    assert "<tool_call>" in hermes[0]["content"] and '"now"' in hermes[0]["content"]
    assert "<tool_call>" not in llama[0]["content"] and '"parameters"' in llama[0]["content"]
    assert hermes[2]["content"].startswith("<tool_call>")
    assert json.loads(llama[2]["content"]) == {"name": "now", "parameters": {"zone": "UTC"}}


def test_tools_on_a_model_without_a_chat_template_are_refused_saying_so(tiny_models, tmp_path):
    import asyncio
    import shutil

    from minisgl.core import SamplingParams
    from minisgl.server.tool_calls import ToolTemplates

    path = shutil.copytree(tiny_models["qwen3"], tmp_path / "plain")
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "chat_template.jinja").unlink(missing_ok=True)
    tools = tools_of([{"type": "function", "function": CLOCK}], None)
    chat = [{"role": "user", "content": "Time?"}]
    prompt = ToolTemplates(str(path), None).prompt(chat, tools, SamplingParams())
    with pytest.raises(RequestError, match="no chat template, so it takes no messages"):
        asyncio.run(prompt)


def test_smollm2s_template_ignores_tools(real_model):
    template = ToolTemplate.of(_tokenizer(real_model))
    assert not template.native and template.format is HERMES


# ---------------------------------------------------------------- the forced call's grammar
def test_the_forced_call_grammar_takes_valid_calls_only():
    pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string as accepts

    both = tool_call_grammar(HERMES, [WEATHER, CLOCK])
    assert accepts(both, '<tool_call>\n{"name": "now", "arguments": {"zone": "UTC"}}\n</tool_call>')
    call = '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}'
    good = f"<tool_call>\n{call}\n</tool_call>"
    assert accepts(both, good)
    assert not accepts(both, good.replace('"days": 3', '"days": 9'))  # maximum 7
    assert not accepts(both, good.replace(', "days": 3', ""))  # required
    assert not accepts(both, good.replace("get_weather", "get_weathers"))
    assert not accepts(both, "Sure! " + good)
    only_clock = tool_call_grammar(LLAMA3_JSON, [CLOCK])
    assert accepts(only_clock, '{"name": "now", "parameters": {"zone": "CET"}}')
    assert not accepts(only_clock, '{"name": "now", "arguments": {"zone": "CET"}}')
    assert not accepts(
        only_clock, '{"name": "get_weather", "parameters": {"city": "Oslo", "days": 3}}'
    )


# ---------------------------------------------------------------- the server: request shapes
def test_a_batch_of_prompts_gives_a_choice_each_in_order_streamed_or_not(server):
    client = server.client()
    prompts = ["Hello world", "Once upon a time", "The weather today"]
    alone = [client.completions.create(model=NAME, prompt=p, **_greedy(6)) for p in prompts]
    batch = client.completions.create(model=NAME, prompt=prompts, **_greedy(6))
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert [c.text for c in batch.choices] == [a.choices[0].text for a in alone]
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert batch.usage.completion_tokens == 18
    stream = client.completions.create(
        model=NAME,
        prompt=prompts,
        stream=True,
        stream_options={"include_usage": True},
        **_greedy(6),
    )
    texts, reasons, usage = ["", "", ""], [None] * 3, None
    for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            texts[c.index] += c.text
            reasons[c.index] = c.finish_reason or reasons[c.index]
    assert texts == [c.text for c in batch.choices] and reasons == ["length"] * 3
    assert usage.completion_tokens == 18 and usage.prompt_tokens == batch.usage.prompt_tokens
    ids = client.completions.create(model=NAME, prompt=[[5, 17, 260], [300, 41]], **_greedy(4))
    assert len(ids.choices) == 2 and ids.usage.prompt_tokens == 5


def test_a_bad_prompt_in_a_batch_refuses_the_batch_and_the_server_goes_on(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError, match="vocab_size"):
        client.completions.create(model=NAME, prompt=[[5, 6], [7, 99999]], max_tokens=3)
    r = _post(server, "/v1/completions", {"model": NAME, "prompt": [1, 2.5]})
    assert r.status_code == 400 and "a list of token-id lists, got a list holding 2.5" in r.text
    assert r.json()["error"]["param"] == "prompt"
    server.wait_idle()  # nothing of the refused batch is left running


def test_text_parts_are_read_as_their_text(server):
    client = server.client()
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "the weather?"}]
    as_parts = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": parts}], **_greedy(8)
    )
    as_text = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "What is\nthe weather?"}], **_greedy(8)
    )
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content\[0\].*text model"):
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": image}])


# ---------------------------------------------------------------- the server: its facts
def test_the_served_name_the_context_and_a_404_for_another_model(server, qwen25):
    client = server.client()
    [card] = client.models.list().data
    assert card.id == NAME and card.root == str(qwen25)
    assert card.max_model_len == min(CONTEXT, PAGES * 4)  # the config's, the pool holds more
    assert client.models.retrieve(NAME).id == NAME
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4o")
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError, match="'gpt-4o' does not exist: this server serves"):
        client.completions.create(model="gpt-4o", prompt="Hi", max_tokens=2)
    with pytest.raises(openai.NotFoundError, match="model_not_found|does not exist"):
        client.chat.completions.create(model="gpt-4o", messages=ASK, max_tokens=2)
    by_path = client.completions.create(model=str(qwen25), prompt="Hi", max_tokens=2)
    assert by_path.model == NAME


def test_the_default_served_name_is_the_model_folders_name():
    from minisgl.server.args import parse_args, served_model_name

    assert served_model_name(parse_args(["--model", "/models/SmolLM2-135M-Instruct/"])) == (
        "SmolLM2-135M-Instruct"
    )
    args = parse_args(
        ["--model", "/m/x", "--served-model-name", "smol", "--tool-call-parser", "hermes"]
    )
    assert served_model_name(args) == "smol" and args.tool_call_parser == "hermes"


# ---------------------------------------------------------------- the server: /generate
def test_sglangs_generate_in_its_shapes(server):
    client = server.client()
    completion = client.completions.create(model=NAME, prompt="Hello world", **_greedy(6))
    ref, ref_usage = completion.choices[0], completion.usage
    sampling = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
    out = _post(server, "/generate", {"text": "Hello world", "sampling_params": sampling}).json()
    assert out["text"] == ref.text and len(out["output_ids"]) == 6
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert (meta["completion_tokens"], meta["prompt_tokens"]) == (6, ref_usage.prompt_tokens)
    assert meta["e2e_latency"] > 0 and meta["id"]
    batch = _post(
        server, "/generate", {"input_ids": [[5, 17], [260, 300, 41]], "sampling_params": sampling}
    )
    assert [len(o["output_ids"]) for o in batch.json()] == [6, 6]
    # streamed as bench_serving reads it: each event the text and the count so far, then [DONE]
    body = {
        "text": "Hello world",
        "sampling_params": sampling,
        "stream": True,
        "lora_path": None,
        "return_logprob": False,
        "logprob_start_len": -1,
    }
    lines = [ln for ln in _post(server, "/generate", body).text.splitlines() if ln]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]]
    counts = [e["meta_info"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and counts[-1] == 6
    assert all(ref.text.startswith(e["text"]) for e in events) and events[-1]["text"] == ref.text
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert events[0]["meta_info"]["finish_reason"] is None or len(events) == 1


def test_generate_takes_the_penalties_and_bias_the_openai_routes_take(server):
    client = server.client()
    bias = {"300": 100}
    for extra in ({"frequency_penalty": 1.5, "repetition_penalty": 1.3}, {"logit_bias": bias}):
        ref = client.completions.create(
            model=NAME,
            prompt="Hello world",
            max_tokens=8,
            temperature=0,
            extra_body={"ignore_eos": True, **extra},
        ).choices[0]
        sampling = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True, **extra}
        out = _post(server, "/generate", {"text": "Hello world", "sampling_params": sampling})
        assert out.status_code == 200 and out.json()["text"] == ref.text, out.text
    assert out.json()["output_ids"] == [300] * 8


@pytest.mark.parametrize(
    "body, words",
    [
        ({"text": "Hi", "return_logprob": True}, "return_logprob=True is not supported"),
        ({"text": "Hi", "sampling_params": {"min_p": 0.1}}, "sampling_params.min_p=0.1"),
        ({"text": "Hi", "sampling_params": {"max_new_tokens": 0}}, "max_tokens must be >= 1"),
        ({"text": "Hi", "input_ids": [1]}, "exactly one of text and input_ids"),
        ({"input_ids": [1, 2.5]}, "input_ids: expected"),
        ({"text": ["a", "b"], "sampling_params": [{}]}, "1 given for 2 prompts"),
    ],
)
def test_a_generate_request_the_engine_cannot_honour_gets_a_400(server, body, words):
    r = _post(server, "/generate", body)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


# ---------------------------------------------------------------- the server: tool calls
def _valid_call(call, functions) -> dict:
    import jsonschema

    function = {f["name"]: f for f in functions}[call.function.name]
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, function["parameters"])
    return args


@pytest.mark.parametrize(
    "choice, functions",
    [
        ("required", [WEATHER, CLOCK]),
        ({"type": "function", "function": {"name": "get_weather"}}, [WEATHER]),
    ],
)
@pytest.mark.parametrize("seed", [None, 3])
def test_a_forced_tool_choice_gives_a_call_whose_arguments_validate(
    server, choice, functions, seed
):
    pytest.importorskip("jsonschema")
    reply = server.client().chat.completions.create(
        model=NAME,
        messages=ASK,
        tools=TOOLS,
        tool_choice=choice,
        max_tokens=120,
        seed=seed,
        temperature=0 if seed is None else 1.0,
    )
    choice_ = reply.choices[0]
    assert choice_.finish_reason == "tool_calls" and choice_.message.content is None
    [call] = choice_.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    _valid_call(call, functions)


def test_a_streamed_tool_call_comes_as_openais_deltas(server):
    client = server.client()
    kwargs = dict(
        model=NAME, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120, temperature=0
    )
    whole = client.chat.completions.create(**kwargs).choices[0].message.tool_calls[0]
    calls, reason, content = {}, None, ""
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            content += c.delta.content or ""
            reason = c.finish_reason or reason
            for d in c.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
                call["name"] += (d.function.name or "") if d.function else ""
                call["arguments"] += (d.function.arguments or "") if d.function else ""
    assert reason == "tool_calls" and content == "" and list(calls) == [0]
    assert calls[0]["id"].startswith("call_")
    assert (calls[0]["name"], json.loads(calls[0]["arguments"])) == (
        whole.function.name,
        json.loads(whole.function.arguments),
    )


def test_a_tool_round_trip_renders_the_call_and_its_result_through_the_template(server, qwen25):
    """The assistant's call (content null) and the tool's result go back; the prompt the
    server counts is the template's rendering of exactly that conversation."""
    client = server.client()
    first = (
        client.chat.completions.create(
            model=NAME,
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=120,
            temperature=0,
        )
        .choices[0]
        .message
    )
    history = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [c.model_dump() for c in first.tool_calls],
        },
        {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "Sunny, 21 C"},
    ]
    final = client.chat.completions.create(model=NAME, messages=history, tools=TOOLS, **_greedy(8))
    assert final.choices[0].finish_reason in ("length", "tool_calls", "stop")
    template = ToolTemplate.of(_tokenizer(qwen25))
    expected = template.prompt_ids(messages_of(history), TOOLS)
    assert final.usage.prompt_tokens == len(expected)
    assert "<tool_response>\nSunny, 21 C\n</tool_response>" in template.tokenizer.decode(expected)


@pytest.mark.parametrize(
    "extra, words",
    [
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "fly"}}},
            "'fly'",
        ),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "drop response_format",
        ),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}
                ],
                "tool_choice": "required",
            },
            "cannot be compiled",
        ),
        ({"tools": [{"type": "function"}]}, "tools[0]"),
    ],
)
def test_a_bad_tool_request_gets_a_400_and_the_server_goes_on(server, extra, words):
    client = server.client()
    with pytest.raises(openai.BadRequestError, match=re.escape(words)):
        client.chat.completions.create(model=NAME, messages=ASK, max_tokens=5, **extra)
    with pytest.raises(openai.BadRequestError, match="tools"):  # completions take no tools
        _ = client.completions.create(
            model=NAME, prompt="Hi", max_tokens=2, extra_body={"tools": TOOLS}
        )
    assert client.chat.completions.create(model=NAME, messages=ASK, max_tokens=2).choices


# ---------------------------------------------------------------- guidance's Lark grammars
# guidance's SGLang client sends select(["yes", "no", "maybe so"]) in ebnf as llguidance's Lark
LARK_SELECT = '%llguidance {}\n\nstart: START\nSTART: "yes"\n     | "no"\n     | "maybe so"\n\n'
OPTIONS = ["yes", "no", "maybe so"]
LARK_TERMINALS = [
    # ("x" + select(["a", "ab"]) + optional("c")), as guidance writes it: the texts it accepts,
    # then texts it does not
    (
        '%llguidance {}\n\nstart: START\nSTART: "x" SELECT OPTIONAL\n\nSELECT: "a"\n     | "ab"'
        '\n\nOPTIONAL: "c"?\n',
        ["xa", "xab", "xabc", "xac"],
        ["x", "xb", "xabcc", "xa "],
    ),
    (
        '%llguidance {}\n\nstart: START\nSTART: ONE_OR_MORE "d"\nONE_OR_MORE: ("a" SELECT)+\n\n'
        'SELECT: "b"\n     | "c"{1,2}\n\n',
        ["abd", "acd", "accabd"],
        ["d", "abbd", "acccd"],
    ),
    # Lark allows spaces around a rule's colon
    ('%llguidance {}\nstart : START\nSTART : "yes" | "no"\n', ["yes", "no"], ["", "yesno"]),
    # JSON's escapes, a surrogate pair among them, as json.dumps writes guidance's literals
    (
        '%llguidance {}\nstart: START\nSTART: "\\u00e9\\ud83d\\ude00" | "q\\"\\\\\\n"\n',
        ["é😀", 'q"\\\n'],
        ["e", "q"],
    ),
]


@pytest.mark.parametrize(
    "lark, accepted, refused",
    [(LARK_SELECT, OPTIONS, ["", "ye", "yesno"]), *LARK_TERMINALS],
    ids=["select", "a join", "repeats", "spaced colons", "escapes"],
)
def test_guidances_lark_of_one_lexeme_becomes_gbnf_that_accepts_the_same_texts(
    lark, accepted, refused
):
    pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string as accepts

    from minisgl.server.lark import ebnf_of

    gbnf = ebnf_of(lark)
    assert gbnf.startswith("root ::= ")
    assert all(accepts(gbnf, text) for text in accepted), gbnf
    assert not any(accepts(gbnf, text) for text in refused), gbnf
    assert ebnf_of('root ::= "a" | "b"') == 'root ::= "a" | "b"'  # GBNF passes as it came


LARK_HEAD = "%llguidance {}\n\nstart: START\n"


@pytest.mark.parametrize(
    "lark, words",
    [
        (LARK_HEAD + 'START: "a"\n     | GEN\n\nGEN: /[0-9]+/\n', "a regular expression"),
        ('%llguidance {}\n\nstart: select\n\nselect: "a"\n     | "b"\n', "the rule 'select'"),
        (
            '%llguidance {}\nstart: n\nn[capture, max_tokens=3]: N\nN: "a"\n',
            "the attributes [capture, max_tokens=3] of 'n'",
        ),
        ('%llguidance {}\nstart: A B\nA: "a" | "ab"\nB: "bc"\n', "start must be one terminal"),
        ('%llguidance {}\nstart: A\nA: "a" A?\n', "the recursive terminal 'A'"),
        ('%llguidance {}\nstart: json\njson: %json {\n  "type": "object"\n}\n', "%json"),
        ('%llguidance {"allow_invalid_utf8": true}\nstart: A\nA: "a"\n', "the options"),
        ('%llguidance {}\nstart: A\nA: "a"i\n', "the literal flag 'i'"),
        (LARK_HEAD + "START: B\n", "'B', which the grammar defines as no terminal"),
    ],
    ids=lambda x: "lark" if x.startswith("%") else x,
)
def test_lark_the_translation_would_change_is_refused_naming_it(lark, words):
    from minisgl.server.lark import ebnf_of

    with pytest.raises(ValueError, match=re.escape(words)):
        ebnf_of(lark)


def test_the_server_holds_a_select_sent_as_lark_on_both_routes(server):
    """As guidance's SGLang client sends a select: the chat's reply is one of the options,
    whole or streamed, and so is /generate's; a grammar with a regular expression gets a 400
    naming ebnf and what it holds, on each route."""
    client = server.client()
    for seed in (1, 2, 3):
        reply = client.chat.completions.create(
            model=NAME, messages=ASK, seed=seed, extra_body={"ebnf": LARK_SELECT}
        )
        assert reply.choices[0].message.content in OPTIONS
        assert reply.choices[0].finish_reason == "stop"  # the grammar's end, not max_tokens
    stream = client.chat.completions.create(
        model=NAME, messages=ASK, seed=4, stream=True, extra_body={"ebnf": LARK_SELECT}
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) in OPTIONS
    native = _post(server, "/generate", {"text": "Hi", "sampling_params": {"ebnf": LARK_SELECT}})
    assert native.status_code == 200 and native.json()["text"] in OPTIONS, native.text
    regex = LARK_HEAD + 'START: "a"\n     | GEN\n\nGEN: /[0-9]+/\n'
    with pytest.raises(openai.BadRequestError, match="ebnf: llguidance's Lark.*regular expression"):
        client.chat.completions.create(model=NAME, messages=ASK, extra_body={"ebnf": regex})
    native = _post(server, "/generate", {"text": "Hi", "sampling_params": {"ebnf": regex}})
    assert native.status_code == 400 and "regular expression" in native.text


# ---------------------------------------------------------------- LangChain, where installed
def test_langchain_binds_tools_and_round_trips(server):
    lc = pytest.importorskip("langchain_openai")
    import pydantic
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    class Weather(pydantic.BaseModel):  # short values: a random model's city fits max_tokens
        city: str = pydantic.Field(pattern=r"^[A-Za-z]{1,8}$")
        days: int = pydantic.Field(ge=1, le=7)

    @tool(args_schema=Weather)
    def get_weather(city: str, days: int) -> str:
        """The weather in a city for some days."""
        return f"Sunny in {city} for {days} days"

    chat = lc.ChatOpenAI(
        model=NAME,
        base_url=server.url + "/v1",
        api_key=KEY,
        temperature=0,
        max_tokens=200,
        max_retries=0,
    )
    bound = chat.bind_tools([get_weather], tool_choice="get_weather")
    ask = HumanMessage("What is the weather in Paris?")
    called = bound.invoke([ask])
    [call] = called.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city", "days"}
    result = get_weather.invoke(call)
    assert isinstance(result, ToolMessage)
    final = chat.bind_tools([get_weather]).invoke([ask, called, result])
    assert final.response_metadata["finish_reason"] in ("stop", "length", "tool_calls")


def test_langchain_structured_output_by_function_calling(server):
    lc = pytest.importorskip("langchain_openai")
    import pydantic

    class City(pydantic.BaseModel):
        """A city and its population."""

        name: str = pydantic.Field(pattern=r"^[A-Za-z]{1,8}$")
        population: int = pydantic.Field(ge=0, le=10**8)

    chat = lc.ChatOpenAI(
        model=NAME,
        base_url=server.url + "/v1",
        api_key=KEY,
        temperature=0,
        max_tokens=200,
        max_retries=0,
    )
    city = chat.with_structured_output(City, method="function_calling").invoke("Name a city.")
    assert isinstance(city, City)
