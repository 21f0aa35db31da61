"""Requests as the tools send them, checked and brought to the engine's terms: a completion's
prompt (one, or a batch), a message's content (a string or a list of text parts), the model a
request names, and the model card that ``/v1/models`` gives. A request the server refuses gets one
``RequestError`` that names the field, says what was wrong and what to send instead."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Dict, List, Sequence

from minisgl.models import ModelConfig
from minisgl.utils.hf import read_hf_config, resolve_model_dir

if TYPE_CHECKING:
    from .args import ServerArgs
    from .launch import SchedulerStats

Message = Dict[str, Any]
Prompt = str | List[int]

PROMPT_SHAPES = "a string, a list of strings, a list of token ids or a list of token-id lists"


class RequestError(ValueError):
    """A refused request: the message, the parameter at fault, the HTTP status and OpenAI's
    error code (None: the status)."""

    def __init__(
        self, message: str, param: str | None = None, status: int = 400, code: str | None = None
    ):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


# ---------------------------------------------------------------- prompts
def _is_token(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def prompts_of(prompt: Any) -> List[Prompt]:
    """A completion's ``prompt`` as a batch: one prompt per choice, in order. A list of ints is
    one prompt of token ids; a list of strings, or of token-id lists, is several."""
    if isinstance(prompt, str):
        prompts: List[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(_is_token(t) for t in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and all(
        isinstance(p, str) or (isinstance(p, list) and all(_is_token(t) for t in p)) for p in prompt
    ):
        prompts = prompt
    else:
        raise RequestError(f"prompt: expected {PROMPT_SHAPES}, got {_shape(prompt)}", "prompt")
    if not prompts:
        raise RequestError("prompt is empty", "prompt")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            where = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
            raise RequestError(f"{where} is empty", "prompt")
    return prompts


def _shape(value: Any) -> str:
    """What a client sent, in a few words (``a list holding 2.5``)."""
    if isinstance(value, list):
        odd = [x for x in value if not (isinstance(x, (str, list)) or _is_token(x))]
        if odd:
            return f"a list holding {json.dumps(odd[0])}"
        return "a list that mixes strings, token ids and lists"
    return f"{type(value).__name__} {json.dumps(value)[:40]}"


# ---------------------------------------------------------------- messages
def text_of(content: Any, where: str) -> str:
    """A message's content as text: a string, or a list of text parts, joined with newlines (as
    vLLM joins them). Any other part (an image, audio, a file) is refused: the engine serves
    text models."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(
            f"{where}: a string or a list of text parts is required, got {_shape(content)}",
            "messages",
        )
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise RequestError(
                f"{where}[{j}]: a part of type {kind!r}; this server serves a text model and "
                "reads only text parts ({'type': 'text', 'text': ...})",
                "messages",
            )
        texts.append(part["text"])
    return "\n".join(texts)


def messages_of(messages: Sequence[Any]) -> List[Message]:
    """Chat messages as the chat template takes them: every content a string; an assistant's
    ``tool_calls`` (its content may then be null) with their arguments as objects, as Hugging
    Face's templates expect; a ``tool`` message's result as text. Other keys pass through."""
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"{where}: a message is an object with a 'role' string", "messages")
        m = dict(m)
        calls = m.get("tool_calls") if m["role"] == "assistant" else None
        if calls:
            m["tool_calls"] = [
                _tool_call_of(c, f"{where}.tool_calls[{k}]") for k, c in enumerate(calls)
            ]
        if calls and m.get("content") is None:
            m["content"] = ""  # an assistant turn that only calls tools has no text
        elif m.get("content") is None:
            raise RequestError(
                f"{where}.content: required (a string or a list of text parts)", "messages"
            )
        else:
            m["content"] = text_of(m["content"], f"{where}.content")
        out.append(m)
    return out


def _tool_call_of(call: Any, where: str) -> Dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RequestError(
            f"{where}: a call is {{'type': 'function', 'function': {{'name', 'arguments'}}}}",
            "messages",
        )
    args = function.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except json.JSONDecodeError as e:
            raise RequestError(
                f"{where}.function.arguments: not JSON ({e}); send the arguments the call had",
                "messages",
            ) from None
    if not isinstance(args, dict):
        raise RequestError(f"{where}.function.arguments: a JSON object is required", "messages")
    return {**call, "type": "function", "function": {"name": function["name"], "arguments": args}}


def has_tool_turns(messages: Sequence[Message]) -> bool:
    """Whether the conversation holds earlier calls or their results."""
    return any(m["role"] == "tool" or m.get("tool_calls") for m in messages)


# ---------------------------------------------------------------- the model
def check_model(name: str | None, served: Sequence[str]) -> None:
    """A request naming a model this server does not serve gets OpenAI's 404; no name (the
    field is optional for most servers' clients) means the one served."""
    if name and name not in served:
        raise RequestError(
            f"The model '{name}' does not exist: this server serves '{served[0]}' "
            "(GET /v1/models lists it)",
            "model",
            status=404,
            code="model_not_found",
        )


def model_card(name: str, root: str, max_model_len: int) -> Dict[str, Any]:
    """``/v1/models``'s entry. ``max_model_len`` is the longest sequence (prompt and reply) the
    server accepts, as vLLM reports it: clients size their prompts by it."""
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "minisgl",
        "root": root,
        "max_model_len": max_model_len,
    }


def max_model_len(args: ServerArgs, stats: SchedulerStats) -> int:
    """The longest sequence the scheduler takes (its ``max_seq_len``): the model's context, or
    ``--max-seq-len``, but no more tokens than the KV pool holds, as the engine caps it."""
    pool = stats.read()["kv_pages_total"] * args.page_size
    return min(_model_len(args.model_path, args.max_seq_len), pool)


@lru_cache(maxsize=None)
def _model_len(model_path: str, asked: int | None) -> int:
    config = ModelConfig.from_dict(read_hf_config(resolve_model_dir(model_path)))
    return asked or config.max_position_embeddings
