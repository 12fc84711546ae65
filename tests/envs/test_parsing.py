"""Tool-call parsing (Hermes / Qwen2.5 ``<tool_call>`` blocks), the text space and argument schemas."""

from __future__ import annotations

import json

import numpy as np
import pytest

from envs.parsing import ToolCall, ToolCallError, format_tool_call, parse_tool_calls
from envs.schema import validate_arguments
from envs.spaces import N_SCALARS, UnicodeText


def test_one_call_with_reasoning_around_it():
    text = 'I will list files.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\nThen wait.'
    parsed = parse_tool_calls(text)
    assert parsed.calls == (ToolCall("bash", {"command": "ls"}, 0),)
    assert parsed.errors == ()
    assert parsed.content == "I will list files.\n\nThen wait."


def test_several_calls_keep_their_order():
    text = format_tool_call("read_file", {"path": "a.py"}) + "\n" + format_tool_call("submit")
    parsed = parse_tool_calls(text)
    assert [c.name for c in parsed.calls] == ["read_file", "submit"]
    assert [c.index for c in parsed.calls] == [0, 1]


def test_missing_close_tag_on_the_last_call_is_accepted():
    parsed = parse_tool_calls('<tool_call>{"name": "bash", "arguments": {"command": "pwd"}}')
    assert parsed.calls[0].arguments == {"command": "pwd"}


def test_arguments_as_a_json_string_and_fenced_json():
    parsed = parse_tool_calls(
        '<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>'
        '<tool_call>```json\n{"name": "submit", "arguments": {}}\n```</tool_call>'
    )
    assert [c.to_dict()["arguments"] for c in parsed.calls] == [{"command": "ls"}, {}]


@pytest.mark.parametrize(
    "body,message",
    [
        ("{bad json", "not valid JSON"),
        ("", "empty tool call"),
        ('["bash"]', "must be a JSON object, got a array"),
        ('{"arguments": {}}', 'no "name" string'),
        ('{"name": "bash", "arguments": [1]}', "\"arguments\" of 'bash' must be a JSON object"),
        ('{"name": "bash", "args": {}}', "unexpected key(s) ['args']"),
        ('{"name": "bash", "arguments": "{oops"}', "a string that is not valid JSON"),
    ],
)
def test_malformed_calls_become_errors_for_the_model(body, message):
    parsed = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert parsed.calls == ()
    assert len(parsed.errors) == 1 and isinstance(parsed.errors[0], ToolCallError)
    assert message in parsed.errors[0].message
    assert parsed.has_tool_syntax


def test_stray_close_tag_and_too_many_calls():
    assert "without a matching" in parse_tool_calls("done </tool_call>").errors[0].message
    parsed = parse_tool_calls(format_tool_call("submit") * 3, max_calls=2)
    assert len(parsed.calls) == 2 and "at most 2 tool calls" in parsed.errors[0].message


def test_plain_text_has_no_tool_syntax():
    parsed = parse_tool_calls("The answer is 42.")
    assert not parsed.has_tool_syntax and parsed.content == "The answer is 42."


def test_format_tool_call_round_trips_unicode_and_newlines():
    args = {"path": "notes.txt", "content": 'line 1\nline "2" — ünïcode 😀\n'}
    assert parse_tool_calls(format_tool_call("write_file", args)).calls[0].arguments == args


def test_unicode_text_space_accepts_every_scalar_value_only():
    space = UnicodeText(16, seed=0)
    assert space.contains("") and space.contains("héllo 世界 😀\x00\n")
    assert not space.contains("\ud800")  # a lone surrogate is not text a tokenizer can produce
    assert not space.contains("x" * 17) and not space.contains(b"bytes")
    assert len(space.character_set) == N_SCALARS and "\U0010ffff" in space.character_set
    samples = [space.sample() for _ in range(50)]
    assert all(space.contains(s) for s in samples)
    assert space.character_index("\ue000") == np.int32(0xE000 - 0x800)
    assert space == UnicodeText(16) and space != UnicodeText(17)


def test_argument_schema_messages_name_the_argument():
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "start_line": {"type": "integer", "minimum": 1}},
        "required": ["path"],
        "additionalProperties": False,
    }
    assert validate_arguments(schema, {"path": "a"}) is None
    assert "missing required argument(s) 'path'" in validate_arguments(schema, {})
    assert "unknown argument(s) 'mode'" in validate_arguments(schema, {"path": "a", "mode": "r"})
    assert "'start_line' must be of type integer" in validate_arguments(schema, {"path": "a", "start_line": "2"})
    assert "must be >= 1" in validate_arguments(schema, {"path": "a", "start_line": 0})
    assert "must be of type integer" in validate_arguments(schema, {"path": "a", "start_line": True})
    json.dumps(schema)  # schemas are plain JSON, as chat templates need
