"""A `gymnasium.spaces.Text` over every Unicode scalar value, without materialising it.

A tokenizer's decoder can emit any code point except the UTF-16 surrogates
(byte-level BPE turns invalid byte sequences into U+FFFD), so the observation
and action spaces must accept all 1,112,064 of them. Gymnasium's ``Text`` stores
its charset as a frozenset, a tuple and a dict: ~150 MB per space for this
charset. :class:`UnicodeText` keeps the ``Text`` interface but answers
membership arithmetically and builds the character list only if a caller asks
for it (masked sampling, flattening).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Set
from typing import Any

import numpy as np
from gymnasium import spaces

SURROGATES = range(0xD800, 0xE000)
N_SCALARS = 0x110000 - len(SURROGATES)


def is_scalar(char: str) -> bool:
    """True if ``char`` is one Unicode scalar value (a code point that is not a surrogate)."""
    if len(char) != 1:
        return False
    code = ord(char)
    return not 0xD800 <= code < 0xE000


def _scalar_at(index: int) -> str:
    """The ``index``-th scalar value in code point order (surrogates skipped)."""
    return chr(index if index < 0xD800 else index + len(SURROGATES))


class UnicodeScalars(Set):
    """The set of all Unicode scalar values; membership is O(1), iteration is lazy."""

    def __contains__(self, char: object) -> bool:
        return isinstance(char, str) and is_scalar(char)

    def __iter__(self) -> Iterator[str]:
        return (_scalar_at(i) for i in range(N_SCALARS))

    def __len__(self) -> int:
        return N_SCALARS

    def __eq__(self, other: object) -> bool:
        if isinstance(other, UnicodeScalars):
            return True
        return Set.__eq__(self, other)

    def __hash__(self) -> int:
        return hash(UnicodeScalars)

    def __repr__(self) -> str:
        return "<all Unicode scalar values>"


class UnicodeText(spaces.Text):
    """Strings of ``min_length..max_length`` Unicode scalar values (lengths in code points).

    ``sample()`` draws code points uniformly from all scalar values (what
    ``check_env`` sends as random actions); masked sampling works too, with a
    mask over :attr:`character_list`, which is built on first use.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | np.random.Generator | None = None):
        # The parent validates the lengths; its tiny placeholder charset is replaced below.
        super().__init__(max_length, min_length=min_length, charset="a", seed=seed)
        self._char_set = UnicodeScalars()  # type: ignore[assignment]
        self._char_list = ()
        self._char_index = {}
        self._char_str = ""

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        length = int(self.np_random.integers(self.min_length, self.max_length + 1))
        indices = self.np_random.integers(0, N_SCALARS, size=length)
        return "".join(_scalar_at(int(i)) for i in indices)

    def contains(self, x: Any) -> bool:
        if not isinstance(x, str) or not self.min_length <= len(x) <= self.max_length:
            return False
        try:
            x.encode("utf-8")  # fails exactly when a lone surrogate is present
        except UnicodeEncodeError:
            return False
        return True

    @property
    def character_list(self) -> tuple[str, ...]:
        return _all_scalars()

    def character_index(self, char: str) -> np.int32:
        if not is_scalar(char):
            raise KeyError(f"character_index(char=): {char!r} is not one Unicode scalar value")
        code = ord(char)
        return np.int32(code if code < 0xD800 else code - len(SURROGATES))

    @property
    def characters(self) -> str:
        return "".join(_all_scalars())

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length}, charset=<all Unicode scalar values>)"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    def __hash__(self) -> int:
        return hash((UnicodeText, self.min_length, self.max_length))


@functools.cache
def _all_scalars() -> tuple[str, ...]:
    return tuple(_scalar_at(i) for i in range(N_SCALARS))
