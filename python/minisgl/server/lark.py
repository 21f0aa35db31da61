"""guidance's grammars: llguidance's Lark syntax, translated into chapter 23's EBNF where the
translation accepts exactly the same texts, and refused, naming the construct, where it would not.

guidance's client for SGLang (``guidance.models.experimental.SglangModel``) sends a ``select`` in
the ``ebnf`` field, written in llguidance's variant of Lark's syntax, not in GBNF:

    %llguidance {}

    start: START
    START: "yes"
         | "no"

Lark tells terminals (upper-case names) from rules (lower-case). A terminal is a regular
language and is read as one lexeme; a rule is a sequence of lexemes, which llguidance's lexer
cuts the text into before its parser sees it. A GBNF rule has no lexer: ``start: A B`` with
``A: "a" | "ab"`` and ``B: "bc"`` accepts "abc" as GBNF, but llguidance's lexer takes the longer
"ab" for A and then finds no B. So the translation takes the grammars that are one lexeme: a
``start`` whose alternatives are each one terminal or one literal, over terminals made of
string literals, other terminals, groups, alternatives and the quantifiers ``? * + {m,n}``.
Each of those has the same meaning in GBNF, construct for construct. That is every grammar guidance
writes from literals, ``select``, joins and repeats without a ``gen``; a ``gen`` brings a regular
expression or rule attributes (``max_tokens``, ``stop``, ``capture``), which xgrammar's EBNF
cannot say.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Tuple

HEADER = "%llguidance"
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\\n]|\\.)*")(?P<flags>[a-z]*)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>[()|*+?])
  | (?P<repeat>\{\s*\d+\s*(?:,\s*\d*\s*)?\})
  | (?P<other>.)
    """,
    re.VERBOSE,
)
# what an unknown character starts, for the refusal's message
_WHAT = {
    "/": "a regular expression (/.../), which GBNF has no literal for",
    "%": "a directive such as %json or %regex",
    "<": "a special token (<...>)",
    "[": "an optional group or rule attributes ([...])",
    "~": "a repetition range (~)",
    "@": "a reference to another grammar (@...)",
    ".": "a range or priority (.)",
}
Token = Tuple[str, str]  # (kind, text)


def is_lark(text: Any) -> bool:
    """Whether ``ebnf`` holds llguidance's Lark rather than GBNF: guidance starts it with the
    ``%llguidance`` header, which no GBNF grammar can hold."""
    return isinstance(text, str) and text.lstrip().startswith(HEADER)


def ebnf_of(text: Any) -> Any:
    """The request's ``ebnf`` as chapter 23 compiles it: GBNF as given, Lark translated."""
    return gbnf_of_lark(text) if is_lark(text) else text


def gbnf_of_lark(text: str) -> str:
    """llguidance's Lark grammar of one lexeme as GBNF, rooted at ``root``; a ValueError that
    names the first construct the translation would change the meaning of."""
    definitions = _definitions(text)
    if "start" not in definitions:
        raise ValueError("the Lark grammar has no start rule")
    for name in definitions:
        if name != "start" and not name.isupper():
            raise _refused(
                f"the rule {name!r}",
                "a rule is a sequence of lexemes cut by llguidance's lexer, which a GBNF rule "
                "has no counterpart for",
            )
    lines = ["root ::= " + _start(definitions["start"], definitions)]
    for name, body in definitions.items():
        if name != "start":
            lines.append(f"{name} ::= {_terminal(name, body, definitions)}")
    _check_not_recursive(definitions)
    return "\n".join(lines) + "\n"


def _definitions(text: str) -> Dict[str, List[Token]]:
    """name -> its body's tokens. A definition starts at the first column with ``name:``; the
    lines indented under it continue it (guidance puts each alternative on its own line)."""
    lines = [line for line in text.splitlines() if line.strip()]
    options = lines[0].strip()[len(HEADER) :].strip()
    try:
        if json.loads(options or "{}") != {}:
            raise _refused(f"the options {options}", "they change how llguidance reads the text")
    except json.JSONDecodeError:
        raise ValueError(f"the Lark header's options are not JSON: {options!r}") from None
    bodies: Dict[str, str] = {}
    name = None
    for line in lines[1:]:
        if line[0].isspace() and name is not None:
            bodies[name] += " " + line.strip()
            continue
        head, colon, body = line.partition(":")
        head = head.strip()
        if not colon or not NAME.fullmatch(head):
            for earlier in bodies.values():  # a %json { ... } spans lines: name the directive
                _tokens(earlier)
            if "[" in head:
                name, _, attributes = head.partition("[")
                raise _refused(
                    f"the attributes [{attributes} of {name!r}",
                    "xgrammar's EBNF has no max_tokens, stop, temperature or capture",
                )
            what = head if colon else line.strip()
            raise _refused(repr(what), "only 'name: body' definitions are translated")
        if head in bodies:
            raise ValueError(f"the Lark grammar defines {head!r} twice")
        name = head
        bodies[name] = body
    return {name: _tokens(body) for name, body in bodies.items()}


def _tokens(body: str) -> List[Token]:
    tokens = []
    for m in _TOKEN.finditer(body):
        kind = m.lastgroup if m.lastgroup != "flags" else "string"
        if kind == "space":
            continue
        if kind == "other":
            what = _WHAT.get(m.group(), f"the character {m.group()!r}")
            raise _refused(what, f"in {body.strip()[:60]!r}")
        if m.group("flags"):
            raise _refused(f"the literal flag {m.group('flags')!r}", "GBNF literals have none")
        tokens.append((kind, m.group(kind)))  # type: ignore[arg-type]
    if not tokens:
        raise ValueError(f"an empty definition: {body!r}")
    return tokens


def _start(tokens: List[Token], definitions: Dict[str, List[Token]]) -> str:
    """``start``'s alternatives, each one terminal or one literal: one lexeme, whichever."""
    alternatives: List[List[Token]] = [[]]
    for token in tokens:
        if token == ("op", "|"):
            alternatives.append([])
        else:
            alternatives[-1].append(token)
    out = []
    for alternative in alternatives:
        if len(alternative) != 1 or alternative[0][0] not in ("name", "string"):
            shown = " ".join(text for _, text in alternative)
            raise _refused(
                f"start: {shown!r}",
                "start must be one terminal or literal per alternative: several lexemes are "
                "cut by llguidance's lexer, which a GBNF rule has no counterpart for",
            )
        out.append(_translated(alternative[0], "start", definitions))
    return " | ".join(out)


def _terminal(name: str, tokens: List[Token], definitions: Dict[str, List[Token]]) -> str:
    out = ""
    for token in tokens:
        text = _translated(token, name, definitions)
        glued = token[0] == "repeat" or text in ("*", "+", "?", ")") or out.endswith("(")
        out += text if glued or not out else " " + text
    return out


def _translated(token: Token, where: str, definitions: Dict[str, List[Token]]) -> str:
    kind, text = token
    if kind == "string":
        try:
            value = json.loads(text)  # guidance writes its literals with json.dumps
        except json.JSONDecodeError:
            raise ValueError(f"{where}: the literal {text} is not a JSON string") from None
        return json.dumps(value, ensure_ascii=False)  # GBNF reads JSON's escapes
    if kind == "name":
        if text == "start" or text not in definitions:
            raise ValueError(
                f"{where} refers to {text!r}, which the grammar defines as no terminal"
            )
        return text
    if kind == "repeat":  # {m}, {m,} or {m,n}, as GBNF writes them
        return re.sub(r"\s+", "", text)
    return text  # ( ) | * + ?: the same in both


def _check_not_recursive(definitions: Dict[str, List[Token]]) -> None:
    """Terminals are regular: Lark refuses one that refers to itself, GBNF would take it."""

    def visit(name: str, path: Tuple[str, ...]) -> None:
        if name in path:
            raise _refused(f"the recursive terminal {name!r}", "a terminal is regular")
        for kind, text in definitions[name]:
            if kind == "name":
                visit(text, path + (name,))

    for name in definitions:
        if name != "start":
            visit(name, ())


def _refused(what: str, why: str) -> ValueError:
    return ValueError(f"llguidance's Lark grammar: {what} cannot be translated to GBNF ({why})")
