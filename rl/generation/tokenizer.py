"""Tokenizers with a turn-by-turn chat encoding: a byte-level default and Hugging Face ``tokenizers``.

The RL loop builds a trajectory as ``prompt ids + sampled ids + observation ids + sampled ids +
...`` and never re-tokenizes it, so the API is organised around the pieces it appends:

  - :meth:`Tokenizer.encode_messages` — the initial prompt (``add_generation_prompt=True``);
  - the sampler's completion ids (ending with ``<|im_end|>`` when the model stopped by itself);
  - :meth:`Tokenizer.completion_suffix_ids` — ``[<|im_end|>]`` if a completion was cut off and
    the conversation goes on anyway, else nothing;
  - :meth:`Tokenizer.encode_turn` — the tool results / user messages that follow, plus the next
    generation prompt.

Concatenating those pieces gives the same ids as ``encode_messages`` of the whole conversation
(tested for both tokenizers), because every piece boundary sits next to a special token and
special tokens split the text before any merge happens. The one caveat is inherent to BPE: an
assistant message written by hand whose content *starts* with whitespace may merge with the
generation prompt's newline when the whole conversation is encoded; sampled completions are
kept token-exact, so the RL loop is unaffected.

This module needs no JAX: environments and external tools can use it alone.
"""

from __future__ import annotations

import abc
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl.generation.chat_format import ChatMLFormat, Message

BYTE_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<|pad|>",
)


class Tokenizer(abc.ABC):
    """Shared chat-encoding logic; subclasses provide ``encode``/``decode`` and the special ids.

    Attributes:
      vocab_size: number of ids the tokenizer can produce (the model's embedding may be larger).
      pad_id: id used to pad batches (never attended to).
      stop_token_ids: ids that end a completion (``<|im_end|>`` and ``<|endoftext|>``).
      chat: the :class:`~rl.generation.chat_format.ChatMLFormat` used to render messages.
    """

    vocab_size: int
    pad_id: int
    stop_token_ids: tuple[int, ...]
    chat: ChatMLFormat

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Ids of ``text``; special-token strings inside it become their special ids."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` (undecodable byte sequences become U+FFFD)."""

    @abc.abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """Id of a token string, or None if it is not in the vocabulary."""

    def _require(self, token: str) -> int:
        token_id = self.token_to_id(token)
        if token_id is None:
            raise ValueError(
                f"{type(self).__name__}: the chat format needs the token {token!r}, which is not in the vocabulary"
            )
        return token_id

    def _init_chat(self, chat: ChatMLFormat) -> None:
        self.chat = chat
        self.im_end_id = self._require(chat.im_end)
        self._require(chat.im_start)
        eot = self.token_to_id("<|endoftext|>")
        self.stop_token_ids = (self.im_end_id,) + ((eot,) if eot is not None else ())

    # -- chat encoding -----------------------------------------------------------------------

    def encode_messages(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> list[int]:
        """Ids of a whole conversation (the prompt, with ``add_generation_prompt=True``)."""
        return self.encode(self.chat.render(messages, tools, add_generation_prompt))

    def encode_turn(self, messages: Message | Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        """Ids of user/tool (or scripted) messages appended after a completion ending in ``<|im_end|>``."""
        if isinstance(messages, Mapping):
            messages = [messages]
        return self.encode(self.chat.render_continuation(messages, add_generation_prompt))

    def encode_observation(self, completion_ids: Sequence[int], observation: str) -> list[int]:
        """Ids appended after a sampled completion: its closing ``<|im_end|>`` if it lacked one, then the
        environment's rendered ``observation`` as the next user turn and the generation prompt."""
        return self.completion_suffix_ids(completion_ids) + self.encode(self.chat.render_observation(observation))

    def encode_results(self, completion_ids: Sequence[int], messages: Sequence[Message]) -> list[int]:
        """Ids appended after a completion for the messages that follow it, as a rollout would show
        them (:meth:`~rl.generation.chat_format.ChatMLFormat.render_results`): what SFT trains on."""
        return self.completion_suffix_ids(completion_ids) + self.encode(self.chat.render_results(messages))

    def encode_completion(self, message: Message) -> list[int]:
        """Ids of an assistant message as the model would emit them after the generation prompt."""
        return self.encode(self.chat.render_completion(message))

    def generation_prompt_ids(self) -> list[int]:
        return self.encode(self.chat.generation_prompt)

    def completion_suffix_ids(self, completion_ids: Sequence[int]) -> list[int]:
        """Ids that close an assistant turn: ``[]`` if it ended with ``<|im_end|>``, else ``[<|im_end|>]``."""
        return [] if completion_ids and completion_ids[-1] == self.im_end_id else [self.im_end_id]


class ByteTokenizer(Tokenizer):
    """256 byte ids followed by the special tokens of :data:`BYTE_SPECIAL_TOKENS`.

    The embedded default of the ``tiny`` model: no files, no training, every string encodable.
    """

    def __init__(self, special_tokens: Sequence[str] = BYTE_SPECIAL_TOKENS, default_system_prompt: str | None = None):
        if len(set(special_tokens)) != len(special_tokens):
            raise ValueError(f"special_tokens: duplicates in {list(special_tokens)}")
        self.special_tokens = {tok: 256 + i for i, tok in enumerate(special_tokens)}
        self._id_to_special = {i: tok for tok, i in self.special_tokens.items()}
        # Longest first so that a token that is a prefix of another never wins.
        alternatives = sorted(self.special_tokens, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")")
        self.vocab_size = 256 + len(special_tokens)
        self._init_chat(ChatMLFormat(default_system_prompt=default_system_prompt))
        self.pad_id = self.special_tokens.get("<|pad|>", self.stop_token_ids[-1])

    def token_to_id(self, token: str) -> int | None:
        return self.special_tokens.get(token)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in self._split.split(text):
            if piece in self.special_tokens:
                ids.append(self.special_tokens[piece])
            elif piece:
                ids.extend(piece.encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        out: list[str] = []
        buf = bytearray()
        for i in ids:
            i = int(i)
            if i < 256:
                buf.append(i)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf.clear()
            if i in self._id_to_special and not skip_special_tokens:
                out.append(self._id_to_special[i])
            # ids beyond the vocabulary (model padding rows) decode to nothing
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers`` tokenizer from a local ``tokenizer.json``.

    ``tokenizer_config.json`` (optional) provides the pad token, an extra stop token (its
    ``eos_token``, if not already one of ``<|im_end|>`` / ``<|endoftext|>``) and the chat template.
    ``default_system_prompt="auto"`` uses Qwen2.5's format for Qwen tokenizers, the template's own
    default system prompt and tool turns for another ChatML template
    (:meth:`~rl.generation.chat_format.ChatMLFormat.from_template`), and none otherwise. ``backend``
    (a ``tokenizers.Tokenizer``) and ``config`` (that file's content) build one without files. Encoding never adds BOS/EOS
    (``add_special_tokens=False``): the chat format writes every special token it needs.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        default_system_prompt: str | None = "auto",
        *,
        backend: Any = None,
        config: Mapping[str, Any] | None = None,
    ):
        if backend is None:
            from tokenizers import Tokenizer as _HFTokenizer

            if path is None:
                raise ValueError("HFTokenizer: give a path to tokenizer.json (or a directory), or a backend")
            path = Path(path)
            file = path / "tokenizer.json" if path.is_dir() else path
            if not file.exists():
                raise FileNotFoundError(f"{file}: tokenizer.json not found")
            backend = _HFTokenizer.from_file(str(file))
            config_file = file.parent / "tokenizer_config.json"
            config = json.loads(config_file.read_text()) if config_file.exists() else {}
        self._tok = backend
        self.config = dict(config or {})
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._init_chat(self._chat_format(self.config, default_system_prompt))
        pad_id, eos_id = (self._config_token_id(self.config, key) for key in ("pad_token", "eos_token"))
        if eos_id is not None and eos_id not in self.stop_token_ids:
            self.stop_token_ids = (*self.stop_token_ids, eos_id)
        self.pad_id = pad_id if pad_id is not None else self.stop_token_ids[-1]

    @staticmethod
    def _chat_format(config: Mapping[str, Any], default_system_prompt: str | None) -> ChatMLFormat:
        """Qwen's tokenizers get Qwen2.5's format; another model's ChatML template its own (its
        default system prompt, its tool turns); with neither, ChatML without a system prompt."""
        template = str(config.get("chat_template") or "")
        is_qwen = "Qwen" in template or "qwen" in str(config.get("tokenizer_class", "")).lower()
        if default_system_prompt != "auto":
            return ChatMLFormat(default_system_prompt=default_system_prompt)
        if is_qwen:
            return ChatMLFormat()
        if ChatMLFormat.im_start in template:
            return ChatMLFormat.from_template(template)
        return ChatMLFormat(default_system_prompt=None)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes ``tokenizer.json`` and ``tokenizer_config.json`` (chat template, special tokens) to ``path``,
        the files ``transformers``' ``AutoTokenizer`` and this class load."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(path / "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **self.config}
        (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")

    def _config_token_id(self, config: Mapping[str, Any], key: str) -> int | None:
        token = config.get(key)
        token = token.get("content") if isinstance(token, Mapping) else token
        return self.token_to_id(token) if isinstance(token, str) else None

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)


def load_tokenizer(path: str | os.PathLike[str] | None = None) -> Tokenizer:
    """``HFTokenizer`` for a directory / ``tokenizer.json`` / ``.gguf`` file; the :class:`ByteTokenizer`
    for ``None`` or ``"byte"``."""
    if path is None or str(path) == "byte":
        return ByteTokenizer()
    if str(path).endswith(".gguf"):
        from rl.generation.gguf_tokenizer import load_gguf_tokenizer

        return load_gguf_tokenizer(path)
    return HFTokenizer(path)
