"""The tokenizer and chat template a GGUF file carries, as an :class:`~rl.generation.tokenizer.HFTokenizer`.

A GGUF file stores a byte-level BPE tokenizer as metadata (``tokenizer.ggml.tokens``, ``.merges``,
``.token_type``, the special ids) plus the name of its pre-tokenizer (``tokenizer.ggml.pre``): how
text is split before merging. The split matters as much as the merges: SmolLM2 was trained with
every digit its own piece, so a tokenizer that keeps "12" whole gives other ids for any text
where a digit run follows a space run. ``transformers``' GGUF loader does not know ``smollm`` and
falls back to GPT-2's split; this module uses llama.cpp's (the model's own ``tokenizer.json``:
``Digits(individual_digits=True)`` then ``ByteLevel``). A pre-tokenizer name not in
:data:`PRE_TOKENIZERS` is refused by name.

Control tokens (``token_type`` 3, e.g. ``<|im_start|>``) become special tokens, so they are
matched whole in text; the chat template (``tokenizer.chat_template``) becomes the
:class:`~rl.generation.chat_format.ChatMLFormat` it renders. Needs ``gguf`` and ``tokenizers``, no JAX.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl.generation.tokenizer import HFTokenizer

_CONTROL, _USER_DEFINED = 3, 4


def _byte_level() -> Any:
    from tokenizers import pre_tokenizers

    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_byte_level() -> Any:
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level()])


# tokenizer.ggml.pre -> the pre-tokenizer llama.cpp applies for it (llama-vocab.cpp's regexes).
PRE_TOKENIZERS: dict[str, Callable[[], Any]] = {
    "default": _byte_level,
    "gpt-2": _byte_level,
    "smollm": _digits_then_byte_level,
}


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the alphabet byte-level vocabularies are written in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def backend_from_gguf(reader: Any, source: str = "gguf") -> tuple[Any, dict[str, Any]]:
    """A ``tokenizers.Tokenizer`` and a ``tokenizer_config.json``-like dict from a GGUF reader."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{source}: GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2')")
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"{source}: GGUF pre-tokenizer {pre!r} is not supported; supported: {sorted(PRE_TOKENIZERS)}")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges", [])]
    spelled = _bytes_to_unicode()
    alphabet = set(spelled.values())
    # Control tokens are stored as plain text; byte-level ones are already in the byte alphabet.
    vocab = {
        t if set(t) <= alphabet else "".join(spelled[b] for b in t.encode("utf-8")): i for i, t in enumerate(tokens)
    }
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    backend.pre_tokenizer = PRE_TOKENIZERS[pre]()
    backend.decoder = decoders.ByteLevel()
    special = [
        AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types, strict=True) if k == _CONTROL
    ]
    backend.add_special_tokens(special)
    backend.add_tokens(
        [AddedToken(t, normalized=False) for t, k in zip(tokens, types, strict=True) if k == _USER_DEFINED]
    )

    def token(key: str) -> str | None:
        index = _field(reader, f"tokenizer.ggml.{key}")
        return tokens[int(index)] if index is not None and 0 <= int(index) < len(tokens) else None

    config = {
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "pad_token": token("padding_token_id"),
        "unk_token": token("unknown_token_id"),
        "chat_template": _field(reader, "tokenizer.chat_template"),
    }
    return backend, {k: v for k, v in config.items() if v is not None}


def load_gguf_tokenizer(path: str | os.PathLike[str], default_system_prompt: str | None = "auto") -> HFTokenizer:
    """The tokenizer and chat format of a ``.gguf`` file (``default_system_prompt="auto"``: the template's)."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    backend, config = backend_from_gguf(gguf.GGUFReader(str(path)), path.name)
    return HFTokenizer(default_system_prompt=default_system_prompt, backend=backend, config=config)
