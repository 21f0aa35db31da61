"""``tool_choice`` "required" or a named function, enforced: a grammar (EBNF, chapter 23's
``SamplingParams.ebnf``) that allows exactly one call, in the family's own syntax, to one of the
given functions, with arguments valid under that function's JSON schema."""

from __future__ import annotations

import json
import re
from typing import Any, Dict, Sequence

from .formats import ToolCallFormat

Function = Dict[str, Any]  # OpenAI's tool["function"]: {"name", "description", "parameters"}


def call_schema(fmt: ToolCallFormat, function: Function) -> Dict[str, Any]:
    """The JSON schema of one call's object: the name first, then the arguments, nothing more."""
    return {
        "type": "object",
        "properties": {
            "name": {"const": function["name"]},
            fmt.args_key: function.get("parameters") or {"type": "object"},
        },
        "required": ["name", fmt.args_key],
        "additionalProperties": False,
    }


def tool_call_grammar(fmt: ToolCallFormat, functions: Sequence[Function]) -> str:
    """The EBNF of one call to one of ``functions``: the format's opening text, the call's
    JSON, its closing text. xgrammar writes each schema's rules; ``union`` and ``concat``
    join its grammars, renaming rules that collide, so no text is spliced by hand.
    A ValueError (xgrammar's message) if a function's schema cannot be compiled."""
    import xgrammar as xgr

    calls = []
    for f in functions:
        try:
            schema = json.dumps(call_schema(fmt, f))
            calls.append(xgr.Grammar.from_json_schema(schema, any_whitespace=False))
        except (RuntimeError, ValueError) as e:  # xgrammar's errors for a schema it cannot read
            message = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(e).strip())  # its time, its line
            raise ValueError(f"{f['name']}'s parameters cannot be compiled: {message}") from None
    call = calls[0] if len(calls) == 1 else xgr.Grammar.union(*calls)
    parts = [xgr.Grammar.from_ebnf(f"root ::= {json.dumps(text)}") for text in (fmt.begin, fmt.end)]
    if fmt.begin or fmt.end:
        call = xgr.Grammar.concat(parts[0], call, parts[1])
    return str(call)
