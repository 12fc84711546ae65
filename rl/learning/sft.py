"""Supervised warm starts: conversations → token-exact sequences with assistant-only loss masks.

A conversation is encoded piece by piece exactly as a rollout would build it —
the prompt, each assistant completion (loss mask 1), each tool/user turn
(mask 0) — so the policy is trained on the same token boundaries it samples
with. Where the conversations come from (a domain's demonstrations, or a JSONL file) is
:mod:`rl.phases.sft_data`'s job, so the learning code imports nothing from ``envs``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rl.generation.tokenizer import Tokenizer

# A chat as messages (role, content, tool calls): the shape ``envs.demonstrations`` produces,
# restated rather than imported so that the learner depends on no environment code.
Conversation = Sequence[Mapping[str, Any]]


def encode_conversation(
    tok: Tokenizer, messages: Conversation, tools: Sequence[Mapping] | None = None
) -> tuple[list[int], list[int]]:
    """``(token_ids, loss_mask)`` with 1 exactly on the assistant completions (and their end token)."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None:
        raise ValueError("encode_conversation: the conversation has no assistant message to learn from")
    ids = tok.encode_messages(messages[:first], tools=tools, add_generation_prompt=True)
    mask = [0] * len(ids)
    i = first
    while i < len(messages):
        message = messages[i]
        if message["role"] != "assistant":
            raise ValueError(f"encode_conversation: expected an assistant message at {i}, got {message['role']!r}")
        completion = tok.encode_completion(message)
        ids += completion
        mask += [1] * len(completion)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if j > i + 1:
            # Tool results as the environment shows them in a rollout (one observation turn), so
            # imitation and RL see the same tokens whatever the chat template does with tool messages.
            following = messages[i + 1 : j]
            if any(m["role"] == "tool" for m in following):
                turn = tok.encode_results(completion, following)
            else:
                turn = tok.completion_suffix_ids(completion) + tok.encode_turn(following)
            ids += turn
            mask += [0] * len(turn)
        i = j
    return ids, mask


class SFTData:
    """Encoded conversations, served in seeded shuffled batches, epoch after epoch.

    Batches mix every kind of conversation in the data. (Grouping batches by
    length would pad less, but a batch holding one kind of conversation only
    swings the policy back and forth between them: on the quickstart the
    tool-calling behaviour never settled.)
    """

    def __init__(self, tok: Tokenizer, conversations: Sequence[Conversation], *, max_len: int, seed: int = 0):
        encoded = [encode_conversation(tok, c) for c in conversations]
        self.sequences = [(ids[:max_len], mask[:max_len]) for ids, mask in encoded]
        self._rng = np.random.default_rng(seed)
        self._batches: list[list[int]] = []
        self._size = 0

    def __len__(self) -> int:
        return len(self.sequences)

    def _new_epoch(self, size: int) -> None:
        order = [int(i) for i in self._rng.permutation(len(self.sequences))]
        batches = [order[j : j + size] for j in range(0, len(order), size)]
        full = [b for b in batches if len(b) == size]
        self._batches = (full or batches)[::-1]  # drop a ragged tail when there are full batches
        self._size = size

    def batch(self, size: int) -> tuple[list[list[int]], list[list[int]]]:
        if not self._batches or self._size != size:
            self._new_epoch(size)
        idx = self._batches.pop()
        return [self.sequences[i][0] for i in idx], [self.sequences[i][1] for i in idx]

    def state(self) -> dict[str, Any]:
        return {"batches": self._batches, "size": self._size, "rng": self._rng.bit_generator.state}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self._batches = [list(b) for b in state["batches"]]
        self._size = int(state["size"])
        self._rng.bit_generator.state = state["rng"]
