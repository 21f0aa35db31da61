"""Tool calls: the families' call syntaxes and their parsers, tools rendered through the chat
template, and the grammar that makes ``tool_choice`` "required" or a named function hold."""

from .formats import FORMATS, HERMES, LLAMA3_JSON, ToolCall, ToolCallFormat, ToolCallStream
from .grammar import call_schema, tool_call_grammar
from .template import ToolTemplate, format_of_template, renders_tools, written_out

__all__ = [
    "FORMATS",
    "HERMES",
    "LLAMA3_JSON",
    "ToolCall",
    "ToolCallFormat",
    "ToolCallStream",
    "ToolTemplate",
    "call_schema",
    "format_of_template",
    "renders_tools",
    "tool_call_grammar",
    "written_out",
]
