"""Tools into the prompt, through the model's own chat template.

A family's template knows how its model was trained to see tools: Qwen2.5's lists them in the
system turn between ``<tools>`` tags, Llama 3.1's in the first user turn, and both write earlier
calls and their results in their own way. ``apply_chat_template(messages, tools=...)`` renders
them. Some templates ignore ``tools`` (SmolLM2's, the tiny models'): for those the server writes
the tools into the conversation itself, in the hermes format, as Qwen2.5's template would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

from .formats import FORMATS, HERMES, LLAMA3_JSON, ToolCallFormat

Message = Dict[str, Any]
Tool = Dict[str, Any]  # OpenAI's {"type": "function", "function": {...}}

_PROBE = {"type": "function", "function": {"name": "probe_7f3e", "parameters": {"type": "object"}}}

# Qwen2.5's own words for the tools, for a template that has none
TOOLS_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
# Llama 3.1's own words, for the JSON calls its format parses (no tags around them)
LLAMA3_TOOLS_PROMPT = (
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\nRespond in the format "
    '{{"name": function name, "parameters": dictionary of argument name and its value}}. '
    "Do not use variables.\n\n{tools}"
)


def renders_tools(tokenizer: Any) -> bool:
    """Whether the chat template writes the ``tools`` it is given (a probe function's name
    shows up in the prompt)."""
    chat = [{"role": "user", "content": "hi"}]
    try:
        text = tokenizer.apply_chat_template(chat, tools=[_PROBE], tokenize=False)
    except Exception:  # a template that fails on tools does not render them either
        return False
    return _PROBE["function"]["name"] in text


def format_of_template(template: str) -> ToolCallFormat | None:
    """The call syntax a template that renders tools teaches its model; None if unknown."""
    if "<tool_call>" in template:
        return HERMES
    if "parameters" in template and ("ipython" in template or "<|python_tag|>" in template):
        return LLAMA3_JSON
    return None


@dataclass
class ToolTemplate:
    """A model's chat template with tools: how to render them, and which syntax to parse."""

    tokenizer: Any
    format: ToolCallFormat | None  # None: the template renders tools in a syntax not known here
    native: bool  # the template renders tools itself; else the server writes them

    @classmethod
    def of(cls, tokenizer: Any, parser: str | None = None) -> ToolTemplate:
        """``parser`` names the format (``--tool-call-parser``); by default it is read from the
        template, and hermes where the template ignores tools."""
        if tokenizer.chat_template is None:
            return cls(tokenizer, None, native=False)
        native = renders_tools(tokenizer)
        if parser is not None:
            return cls(tokenizer, FORMATS[parser], native)
        return cls(
            tokenizer, format_of_template(tokenizer.chat_template) if native else HERMES, native
        )

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[Tool]) -> List[int]:
        """The conversation, with ``tools`` (none: the plain template), as token ids, encoded as
        the tokenizer worker encodes a chat: the template writes every special token."""
        if self.tokenizer.chat_template is None:
            raise ValueError("this tokenizer has no chat template: send a prompt, not messages")
        kwargs: Dict[str, Any] = {"tools": list(tools)} if tools and self.native else {}
        if not self.native:
            messages = written_out(messages, tools, self.format or HERMES)
        text = self.tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=False, **kwargs
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def written_out(
    messages: Sequence[Message], tools: Sequence[Tool], fmt: ToolCallFormat
) -> List[Message]:
    """For a template that ignores tools: the tools in the system turn, with the instructions
    of ``fmt``'s family (Qwen2.5's words for hermes, Llama 3.1's for its JSON), earlier calls as
    the assistant's text in ``fmt``'s syntax, results as user turns in ``<tool_response>`` tags;
    every message then has a role and a text that any template renders."""
    out: List[Message] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [fmt.begin + _call_json(fmt, c) + fmt.end for c in m["tool_calls"]]
            text = "\n".join([m["content"]] + calls if m["content"] else calls)
            out.append({"role": "assistant", "content": text})
        elif m["role"] == "tool":
            text = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("_tool_results"):  # results of one turn share a user turn
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text, "_tool_results": True})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    for m in out:
        m.pop("_tool_results", None)
    if tools:
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        words = LLAMA3_TOOLS_PROMPT if fmt is LLAMA3_JSON else TOOLS_PROMPT
        prompt = words.format(tools=listed)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _call_json(fmt: ToolCallFormat, call: Dict[str, Any]) -> str:
    function = call["function"]
    return json.dumps(
        {"name": function["name"], fmt.args_key: function["arguments"]}, ensure_ascii=False
    )
