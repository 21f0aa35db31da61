"""Tool calls in OpenAI's chat API: ``tools`` and ``tool_choice`` checked, the grammar that makes
"required" or a named function hold, and a choice's text turned into ``tool_calls``, whole or as
the deltas OpenAI streams."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Sequence, Tuple

from jinja2 import TemplateError

from minisgl.core import SamplingParams
from minisgl.function_call import (
    ToolCall,
    ToolCallFormat,
    ToolCallStream,
    ToolTemplate,
    tool_call_grammar,
)

from .protocol import Message, RequestError

Function = Dict[str, Any]
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name


@dataclass
class ToolRequest:
    """The functions a chat may call and what ``tool_choice`` asks: "auto" (the model decides),
    "required" (one call, to any of them) or one function's name (one call, to it)."""

    functions: List[Function]
    choice: str

    @property
    def names(self) -> List[str]:
        return [f["name"] for f in self.functions]

    @property
    def tools(self) -> List[Dict[str, Any]]:
        """In OpenAI's shape, as chat templates take them; a named choice shows that one only."""
        shown = [f for f in self.functions if self.choice in ("auto", "required", f["name"])]
        return [{"type": "function", "function": f} for f in shown]

    @property
    def forced(self) -> List[Function] | None:
        """The functions a grammar must hold the reply to, or None when the model chooses."""
        if self.choice == "auto":
            return None
        return [f for f in self.functions if self.choice in ("required", f["name"])]


def tools_of(tools: Any, tool_choice: Any) -> ToolRequest | None:
    """The request's tools, checked; None when the chat may call none (no tools, or
    ``tool_choice`` "none": then the template is given no tools either)."""
    choice = _choice_of(tool_choice)
    if not tools:
        if choice not in ("auto", "none"):
            raise RequestError(f"tool_choice={choice!r} needs tools, and none were given", "tools")
        return None
    if not isinstance(tools, list):
        raise RequestError("tools: a list of {'type': 'function', 'function': {...}}", "tools")
    functions = [_function_of(t, f"tools[{i}]") for i, t in enumerate(tools)]
    names = [f["name"] for f in functions]
    if len(set(names)) < len(names):
        raise RequestError(f"tools: two functions share a name: {names}", "tools")
    if choice not in ("auto", "none", "required") and choice not in names:
        raise RequestError(
            f"tool_choice names {choice!r}, which is not among the tools ({', '.join(names)})",
            "tool_choice",
        )
    return None if choice == "none" else ToolRequest(functions, choice)


def _choice_of(tool_choice: Any) -> str:
    """The choice: "none", "auto", "required", or the name a named choice gives
    (``{"type": "function", "function": {"name": ...}}``)."""
    if tool_choice is None:
        return "auto"
    if tool_choice in ("none", "auto", "required"):
        return tool_choice
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str):
        raise RequestError(
            "tool_choice: 'none', 'auto', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}",
            "tool_choice",
        )
    return name


def _function_of(tool: Any, where: str) -> Function:
    function = tool.get("function") if isinstance(tool, dict) else None
    if (
        not isinstance(tool, dict)
        or tool.get("type") != "function"
        or not isinstance(function, dict)
    ):
        raise RequestError(
            f"{where}: a tool is {{'type': 'function', 'function': {{'name', 'parameters'}}}}",
            "tools",
        )
    name = function.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise RequestError(
            f"{where}.function.name: 1 to 64 letters, digits, '_' or '-', got {name!r}", "tools"
        )
    params = function.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise RequestError(f"{where}.function.parameters: a JSON schema (an object)", "tools")
    return function


def constrained(params: SamplingParams, tools: ToolRequest, fmt: ToolCallFormat) -> SamplingParams:
    """``params`` with the grammar of one call to a forced function (chapter 23 compiles it,
    and refuses it with xgrammar's message if a schema cannot be compiled)."""
    forced = tools.forced
    if forced is None:
        return params
    if params.json_schema or params.regex or params.ebnf:
        raise RequestError(
            f"tool_choice={tools.choice!r} constrains the reply already: drop response_format, "
            "regex or ebnf",
            "tool_choice",
        )
    try:
        return replace(params, ebnf=tool_call_grammar(fmt, forced))
    except ImportError:
        raise RequestError(
            f"tool_choice={tools.choice!r} needs xgrammar (pip install -e '.[structured]')",
            "tool_choice",
        ) from None
    except ValueError as e:
        raise RequestError(f"tools: {e}", "tools") from None


class ToolTemplates:
    """The API server's own copy of the tokenizer, loaded at the first chat with tools: such a
    chat's prompt is rendered here, since only this process knows the tools and how the reply
    will be parsed; the tokenizer worker then takes the prompt's token ids as they are."""

    def __init__(self, model_path: str, parser: str | None):
        self.model_path, self.parser = model_path, parser
        self._template: ToolTemplate | None = None

    async def get(self) -> ToolTemplate:
        if self._template is None:  # in a thread: loading takes a moment, the loop goes on
            self._template = await asyncio.to_thread(self._load)
        return self._template

    def _load(self) -> ToolTemplate:
        from transformers import AutoTokenizer

        return ToolTemplate.of(AutoTokenizer.from_pretrained(self.model_path), self.parser)

    async def prompt(
        self, messages: List[Message], tools: ToolRequest | None, params: SamplingParams
    ) -> Tuple[List[int], SamplingParams, ToolCallFormat | None]:
        """The chat's prompt ids, its sampling parameters (with the grammar of a forced call)
        and the syntax its reply is parsed with."""
        template = await self.get()
        fmt = template.format
        if template.tokenizer.chat_template is None:
            raise RequestError(
                "this model has no chat template, so it takes no messages: send a prompt to "
                "/v1/completions",
                "messages",
            )
        if tools is not None and fmt is None:
            raise RequestError(
                "this model's chat template writes tool calls in a syntax this server does not "
                "know: start it with --tool-call-parser hermes or llama3_json",
                "tools",
            )
        if tools is not None:
            params = constrained(params, tools, fmt)  # type: ignore[arg-type]
        try:
            ids = await asyncio.to_thread(
                template.prompt_ids, messages, tools.tools if tools else []
            )
        except (TemplateError, TypeError, ValueError) as e:
            raise RequestError(f"messages: the chat template cannot render them: {e}", "messages")
        return ids, params, fmt


class ChatChoice:
    """One chat choice's text as OpenAI gives it: the message, or the deltas of a stream. With
    tools, the family's parser finds the calls; text that may begin one is held until it is
    known."""

    def __init__(self, tools: ToolRequest | None, fmt: ToolCallFormat | None):
        self._parser = ToolCallStream(fmt, tools.names) if tools and fmt else None
        self._calls: List[ToolCall] = []

    def deltas(self, piece: str) -> List[Dict[str, Any]]:
        if self._parser is None:
            return [{"content": piece}] if piece else []
        return self._deltas(self._parser.feed(piece))

    def finish(self) -> List[Dict[str, Any]]:
        """The deltas of what was held to the end (a call, or text after all)."""
        return [] if self._parser is None else self._deltas(self._parser.finish())

    def message(self, text: str) -> Dict[str, Any]:
        """The whole reply as an assistant message; its content is null when it only calls."""
        if self._parser is None:
            return {"role": "assistant", "content": text}
        events = self._parser.feed(text) + self._parser.finish()
        content = "".join(e for kind, e in events if kind == "text")
        self._calls = [e for kind, e in events if isinstance(e, ToolCall)]
        if not self._calls:
            return {"role": "assistant", "content": content}
        calls = [_call_json(c) for c in self._calls]
        return {"role": "assistant", "content": content or None, "tool_calls": calls}

    def finish_reason(self, reason: str) -> str:
        """ "tool_calls" for a reply that ended (not cut by max_tokens) having called."""
        return "tool_calls" if self._calls and reason == "stop" else reason

    def _deltas(self, events: Sequence[Any]) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        for kind, event in events:
            if kind == "text":
                out.append({"content": event})
                continue
            index = len(self._calls)
            self._calls.append(event)
            # as OpenAI streams a call: its id and name first, then its arguments
            head = {**_call_json(event), "index": index}
            head["function"] = {"name": event.name, "arguments": ""}
            out.append({"tool_calls": [head]})
            out.append(
                {"tool_calls": [{"index": index, "function": {"arguments": event.arguments}}]}
            )
        return out


def _call_json(call: ToolCall) -> Dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
