"""How a model family writes a tool call, and the parser that turns its text back into calls.

Two formats cover the families this book serves:

    hermes       Qwen2, Qwen2.5, Qwen3 (and NousResearch's Hermes, which the format is named after):
                 <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>, one block a call
    llama3_json  Llama 3.1 / 3.2: the whole reply is {"name": "f", "parameters": {...}}, several
                 calls joined by "; "

A parser works on text, whole (``parse``) or as it streams (``ToolCallStream``): a streamed reply
cannot tell text from a call until it has seen the marker, so text that may be the start of one
is held back until the next piece says which it is.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Collection, Dict, List, Tuple


@dataclass
class ToolCall:
    """One call as OpenAI returns it: the function's name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))


Event = Tuple[str, "str | ToolCall"]  # ("text", piece) or ("call", ToolCall)


@dataclass(frozen=True)
class ToolCallFormat:
    """A family's tool-call syntax: the text around each call and the key of its arguments."""

    name: str
    begin: str  # the text before a call's JSON ("" when the JSON stands alone)
    end: str  # the text after it
    args_key: str  # "arguments" (hermes) or "parameters" (llama3_json)

    def call_of(self, text: str, tools: Collection[str]) -> ToolCall | None:
        """The call this JSON text writes, or None: not JSON, not an object with a known
        function's name and an object of arguments (then it is the model's text, not a call)."""
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or obj.get("name") not in tools:
            return None
        args = obj.get(self.args_key, obj.get("arguments", obj.get("parameters", {})))
        if not isinstance(args, dict):
            return None
        return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))

    def parse(self, text: str, tools: Collection[str]) -> Tuple[str, List[ToolCall]]:
        """A whole reply as (text, calls): what the streaming parser gives, joined."""
        stream = ToolCallStream(self, tools)
        events = stream.feed(text) + stream.finish()
        content = "".join(e for kind, e in events if kind == "text")
        return content, [e for kind, e in events if isinstance(e, ToolCall)]


HERMES = ToolCallFormat("hermes", begin="<tool_call>\n", end="\n</tool_call>", args_key="arguments")
LLAMA3_JSON = ToolCallFormat("llama3_json", begin="", end="", args_key="parameters")
FORMATS: Dict[str, ToolCallFormat] = {f.name: f for f in (HERMES, LLAMA3_JSON)}


class ToolCallStream:
    """A reply's text, piece by piece, as events: text the client may see now, and calls once
    whole. Whitespace next to a call is no one's text: it is held until text follows it."""

    def __init__(self, fmt: ToolCallFormat, tools: Collection[str]):
        self.fmt, self.tools = fmt, tools
        self._held = ""  # text not yet given out: may be a call's start, or whitespace
        self._mode = "start"  # llama3_json: "start" until the first visible character
        self.num_calls = 0
        self._after_call = False

    def feed(self, piece: str) -> List[Event]:
        self._held += piece
        if self.fmt.begin:
            return self._tagged(final=False)
        return self._bare(final=False)

    def finish(self) -> List[Event]:
        """The end of the reply: what was held is a call if it parses, else text."""
        events = self._tagged(final=True) if self.fmt.begin else self._bare(final=True)
        self._held = ""
        return events

    def _tagged(self, final: bool) -> List[Event]:
        """hermes: calls between markers, text around them."""
        events: List[Event] = []
        begin, end = self.fmt.begin.strip(), self.fmt.end.strip()
        while (start := self._held.find(begin)) >= 0:
            events += self._text(self._held[:start].rstrip())  # whitespace before a call: none
            stop = self._held.find(end, start)
            if stop < 0 and not final:
                self._held = self._held[start:]
                return events
            body_end = len(self._held) if stop < 0 else stop
            block_end = len(self._held) if stop < 0 else stop + len(end)
            call = self.fmt.call_of(self._held[start + len(begin) : body_end], self.tools)
            events += self._call(call) if call else self._text(self._held[start:block_end])
            self._held = self._held[block_end:]
        if final:
            events += self._text(self._held.rstrip())
            self._held = ""
            return events
        # give out what cannot begin a call, less its whitespace at the end
        keep = _partial_suffix(self._held, begin)
        ready = self._held[: len(self._held) - keep].rstrip()
        events += self._text(ready)
        self._held = self._held[len(ready) :]
        return events

    def _bare(self, final: bool) -> List[Event]:
        """llama3_json: a reply that opens with "{" is calls if it parses whole, else text."""
        if self._mode == "start":
            visible = self._held.lstrip()
            if not visible and not final:
                return []
            self._mode = "calls" if visible.startswith("{") else "text"
        if self._mode == "text":
            events, self._held = _as_text(self._held), ""
            return events
        if not final:
            return []
        calls = self._json_calls(self._held)
        if calls is None:
            return _as_text(self._held)
        return [e for call in calls for e in self._call(call)]

    def _json_calls(self, text: str) -> List[ToolCall] | None:
        """Objects joined by ";", every one a call; None if any is not."""
        calls = [self.fmt.call_of(part, self.tools) for part in _split_objects(text)]
        if not calls or any(c is None for c in calls):
            return None
        return calls  # type: ignore[return-value]

    def _call(self, call: ToolCall) -> List[Event]:
        self.num_calls += 1
        self._after_call = True
        return [("call", call)]

    def _text(self, text: str) -> List[Event]:
        """Text for the client; after a call, without the whitespace that separates them."""
        if self._after_call:
            text = text.lstrip()
        if not text:
            return []
        self._after_call = False
        return [("text", text)]


def _as_text(text: str) -> List[Event]:
    return [("text", text)] if text else []


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker`` (held: it may be one)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _split_objects(text: str) -> List[str]:
    """JSON values one after another, joined by ";" or whitespace, as their texts."""
    decoder, parts, i = json.JSONDecoder(), [], 0
    text = text.strip()
    while i < len(text):
        try:
            _, j = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return [text]  # not a sequence of JSON values: one part, which will not parse
        parts.append(text[i:j])
        i = j
        while i < len(text) and text[i] in "; \t\r\n":
            i += 1
    return parts
