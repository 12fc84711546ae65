"""Chat rendering against `transformers`' Jinja rendering, and turn-by-turn == whole encoding."""

from __future__ import annotations

import json

import pytest

from envs import parse_tool_calls
from rl.generation.chat_format import QWEN_DEFAULT_SYSTEM, ChatMLFormat
from rl.generation.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer
from tests.conftest import import_or_skip

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the sandbox.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    },
    {"type": "function", "function": {"name": "submit", "description": "Finish.", "parameters": {"type": "object"}}},
]

CONVERSATION = [
    {"role": "system", "content": "You fix bugs. Réponds brièvement."},
    {"role": "user", "content": "The tests fail:\n  assert add(2, 2) == 4\nPlease fix 🙂 (修复)."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "bash", "arguments": {"cmd": "cat add.py"}}}],
    },
    {"role": "tool", "content": "def add(a, b):\n    return a - b"},
    {
        "role": "assistant",
        "content": "I see the bug.",
        "tool_calls": [
            {"name": "bash", "arguments": {"cmd": "sed -i 's/-/+/' add.py"}},
            {"name": "bash", "arguments": '{"cmd": "pytest -q"}'},
        ],
    },
    {"role": "tool", "content": ""},
    {"role": "tool", "content": "1 passed in 0.01s"},
    {"role": "assistant", "content": "Fixed: `a - b` → `a + b`."},
    {"role": "user", "content": "Thanks! Now submit."},
    {"role": "assistant", "content": "", "tool_calls": [{"name": "submit", "arguments": {}}]},
]

# Qwen2.5's chat template, written out for the reference rendering by transformers' Jinja engine.
QWEN25_TEMPLATE = """{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}{{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}{%- else %}{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- for message in messages %}{%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- elif message.role == "assistant" %}{{- '<|im_start|>' + message.role }}{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}{{- '\\n<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- elif message.role == "tool" %}{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""


def _jinja_messages(messages):
    """The template applies `tojson` to arguments: give it dicts, as transformers users do."""
    out = []
    for m in messages:
        calls = []
        for c in m.get("tool_calls", []):
            c = c.get("function", c)
            args = json.loads(c["arguments"]) if isinstance(c["arguments"], str) else c["arguments"]
            calls.append({"function": {"name": c["name"], "arguments": args}})
        out.append({**m, "tool_calls": calls} if calls else dict(m))
    return out


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """A tiny byte-level BPE trained here, with Qwen's special / added tokens, saved as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    corpus = [json.dumps(m) for m in CONVERSATION] + [t["function"]["description"] for t in TOOLS] * 5
    corpus += ["def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the lazy dog. " * 3]
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.add_tokens(["<tool_call>", "</tool_call>"])  # added, not special, as in Qwen2.5
    path = tmp_path_factory.mktemp("bpe")
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"pad_token": "<|endoftext|>", "tokenizer_class": "Qwen2Tokenizer"})
    )
    return path


@pytest.fixture(scope="module", params=["byte", "bpe"])
def tokenizer(request, bpe_dir):
    return ByteTokenizer(default_system_prompt=QWEN_DEFAULT_SYSTEM) if request.param == "byte" else HFTokenizer(bpe_dir)


@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("with_system", [True, False])
def test_render_matches_transformers_jinja(bpe_dir, tools, with_system):
    import_or_skip("jinja2")
    PreTrainedTokenizerFast = import_or_skip("transformers").PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(bpe_dir / "tokenizer.json"))
    messages = CONVERSATION if with_system else CONVERSATION[1:]
    for gen in (False, True):
        expected = hf.apply_chat_template(
            _jinja_messages(messages),
            tools=tools,
            chat_template=QWEN25_TEMPLATE,
            tokenize=False,
            add_generation_prompt=gen,
        )
        assert ChatMLFormat().render(messages, tools, add_generation_prompt=gen) == expected


def test_turn_by_turn_equals_whole(tokenizer):
    """prompt + completion + observation + ... == the whole conversation, token for token."""
    msgs = CONVERSATION
    whole = tokenizer.encode_messages(msgs, tools=TOOLS)
    pieces = tokenizer.encode_messages(msgs[:2], tools=TOOLS, add_generation_prompt=True)
    turns = [(2, 3, 4), (4, 5, 7), (7, 8, 9), (9, None, None)]
    for assistant, obs_start, obs_end in turns:
        completion = tokenizer.encode_completion(msgs[assistant])
        assert completion[-1] in tokenizer.stop_token_ids
        pieces += completion + tokenizer.completion_suffix_ids(completion)
        if obs_start is not None:
            pieces += tokenizer.encode_turn(msgs[obs_start:obs_end], add_generation_prompt=True)
    assert whole == pieces + tokenizer.encode("\n")
    assert tokenizer.decode(whole) == ChatMLFormat().render(msgs, TOOLS)


def test_the_environments_observation_is_the_turn_the_chat_template_renders(tokenizer):
    """The rollout appends the env's rendered observation; it must be token for token the template's turn."""
    import envs
    from envs import observation_text

    completion = tokenizer.encode_completion(CONVERSATION[2])
    for start, end in ((3, 4), (5, 7), (8, 9)):
        observation = observation_text(CONVERSATION[start:end])
        expected = tokenizer.completion_suffix_ids(completion) + tokenizer.encode_turn(CONVERSATION[start:end])
        assert tokenizer.encode_observation(completion, observation) == expected
    corrective = {"role": "user", "content": envs.core.NO_TOOL_CALL}
    assert tokenizer.encode_observation(completion, corrective["content"]) == tokenizer.encode_turn(corrective)
    truncated = tokenizer.encode("I will look at the fi")
    observation = observation_text(CONVERSATION[3:4])
    assert tokenizer.encode_observation(truncated, observation) == tokenizer.completion_suffix_ids(
        truncated
    ) + tokenizer.encode_turn(CONVERSATION[3:4])


def test_truncated_completion_is_closed_before_the_next_turn(tokenizer):
    prompt = tokenizer.encode_messages(CONVERSATION[:2], add_generation_prompt=True)
    truncated = tokenizer.encode("I will look at the fi")  # cut by max_new_tokens
    suffix = tokenizer.completion_suffix_ids(truncated)
    assert suffix == tokenizer.encode("<|im_end|>")
    follow = tokenizer.encode_turn({"role": "user", "content": "Go on."})
    expected = [
        *CONVERSATION[:2],
        {"role": "assistant", "content": "I will look at the fi"},
        {"role": "user", "content": "Go on."},
    ]
    assert prompt + truncated + suffix + follow == tokenizer.encode_messages(expected, add_generation_prompt=True)


def test_special_ids_and_decoding(tokenizer):
    ids = tokenizer.encode("<|im_start|>user\nhé<|im_end|>")
    assert ids[0] == tokenizer.token_to_id("<|im_start|>") and ids[-1] == tokenizer.token_to_id("<|im_end|>")
    assert tokenizer.decode(ids) == "<|im_start|>user\nhé<|im_end|>"
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhé"
    assert tokenizer.stop_token_ids[0] == tokenizer.token_to_id("<|im_end|>")
    assert tokenizer.token_to_id("<|endoftext|>") in tokenizer.stop_token_ids
    assert tokenizer.pad_id < tokenizer.vocab_size
    assert tokenizer.generation_prompt_ids() == tokenizer.encode("<|im_start|>assistant\n")


def test_tool_calls_round_trip_through_the_completion(tokenizer):
    """A rendered completion's tool calls are what the environments parse back out of its text."""
    completion = tokenizer.encode_completion(CONVERSATION[4])
    calls = parse_tool_calls(tokenizer.decode(completion)).calls
    assert [(c.name, dict(c.arguments)) for c in calls] == [
        ("bash", {"cmd": "sed -i 's/-/+/' add.py"}),
        ("bash", {"cmd": "pytest -q"}),
    ]
    broken = parse_tool_calls(
        tokenizer.decode(tokenizer.encode('<tool_call>\n{"name": "bash", "arguments": \n</tool_call>'))
    )
    assert not broken.calls and len(broken.errors) == 1


def test_byte_tokenizer_defaults():
    tok = load_tokenizer(None)
    assert tok.vocab_size == 264 and tok.encode("A") == [65]
    # No system prompt is injected by default for the byte-level model.
    assert tok.chat.render([{"role": "user", "content": "x"}]) == "<|im_start|>user\nx<|im_end|>\n"
    assert tok.decode([0xE2, 0x82]) == "\ufffd"  # a cut multi-byte character does not raise
    assert tok.decode([65, 300]) == "A"  # embedding padding ids decode to nothing


def test_bad_messages_are_named():
    fmt = ChatMLFormat()
    with pytest.raises(ValueError, match=r"messages\[1\]\['role'\]"):
        fmt.render([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}])
    with pytest.raises(TypeError, match=r"messages\[0\]\['content'\]"):
        fmt.render([{"role": "user", "content": 3}])
    with pytest.raises(ValueError, match=r"tool_calls'\]\[0\]\['name'\]"):
        fmt.render([{"role": "assistant", "content": "", "tool_calls": [{"arguments": {}}]}])
    with pytest.raises(ValueError, match="not in the vocabulary"):
        ByteTokenizer(special_tokens=("<|endoftext|>",))


def test_sft_shows_tool_results_as_a_rollout_does_whatever_the_template_renders():
    """With a template that renders tool messages as their own ``tool`` turns (SmolLM2's), a
    demonstration's tool results still reach the learner as the environment's observation turn,
    the tokens the policy reads in a rollout; the template's rendering would be a different turn."""
    from envs import observation_text
    from rl.learning.sft import encode_conversation

    tok = ByteTokenizer()
    tok._init_chat(ChatMLFormat(default_system_prompt=None, tool_role="tool"))
    call = {"role": "assistant", "content": '<tool_call>\n{"name": "python", "arguments": {}}\n</tool_call>'}
    result = {"role": "tool", "content": "408\n[exit code: 0]"}
    answer = {"role": "assistant", "content": "408"}
    conversation = [{"role": "user", "content": "12*34"}, call, result, answer]
    ids, mask = encode_conversation(tok, conversation)
    completion = tok.encode_completion(call)
    expected = tok.encode_messages(conversation[:1], add_generation_prompt=True) + completion
    expected += tok.encode_observation(completion, observation_text([result])) + tok.encode_completion(answer)
    assert ids == expected
    assert sum(mask) == len(completion) + len(tok.encode_completion(answer))
    assert tok.chat.render_continuation([result]) != tok.chat.render_results([result])
    assert "<|im_start|>tool\n408" in tok.chat.render([conversation[0], call, result])
