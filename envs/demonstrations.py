"""SFT demonstration sources by name: what a supervised warm start imitates before RL.

A domain that can show how its tasks are done registers a source with
:func:`register_demonstrations`; a trainer asks for one by the name its config
gives (``config.sft.data``), with the config's options::

    from envs.demonstrations import demonstrations
    conversations = demonstrations("arithmetic", {"num_tasks": 4000, "tool_fraction": 0.4})

A conversation is a list of chat messages (``{"role", "content"}``, tool
messages with ``"name"``) whose tool turns are exactly what the environment's
tools print, so the warm-started policy sees at training time the observations
it will see at rollout time. Sources check their options and name the unknown
ones. Registered with the shipped domains: ``arithmetic``
(:mod:`envs.domains.arithmetic.demos`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Conversation = list[dict[str, Any]]
DemonstrationSource = Callable[[Mapping[str, Any]], list[Conversation]]
DEMONSTRATIONS: dict[str, DemonstrationSource] = {}
_OPTIONS: dict[str, Mapping[str, Any]] = {}  # each source's options and their defaults


def register_demonstrations(
    name: str, options: Mapping[str, Any] | None = None
) -> Callable[[DemonstrationSource], DemonstrationSource]:
    """Decorator: ``fn(options) -> [conversation, ...]`` becomes the demonstration source ``name``.

    ``options``: the option names it takes, with their defaults; :func:`demonstrations` refuses any
    other and passes them filled in, and a config loader checks ``sft.options`` against them."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"register_demonstrations(name=): expected an identifier, got {name!r}")

    def wrap(fn: DemonstrationSource) -> DemonstrationSource:
        known = DEMONSTRATIONS.get(name)
        if known is not None and (known.__module__, known.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"register_demonstrations: {name!r} is already registered to {known.__qualname__}")
        DEMONSTRATIONS[name] = fn
        _OPTIONS[name] = dict(options or {})
        return fn

    return wrap


def demonstration_options(name: str) -> Mapping[str, Any]:
    """The options the source ``name`` takes, with their defaults."""
    if name not in DEMONSTRATIONS:
        raise KeyError(f"demonstration_options(name=): unknown source {name!r}; registered: {sorted(DEMONSTRATIONS)}")
    return dict(_OPTIONS[name])


def demonstrations(name: str, options: Mapping[str, Any] | None = None) -> list[Conversation]:
    """The conversations of the source ``name``, built with ``options``; the error lists the registered names."""
    defaults = demonstration_options(name)
    unknown = sorted(set(options or {}) - set(defaults))
    if unknown:
        raise ValueError(f"demonstrations({name!r}): unknown option(s) {unknown}; options: {sorted(defaults)}")
    return DEMONSTRATIONS[name]({**defaults, **(options or {})})
