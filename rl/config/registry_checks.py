"""The config's free-form sections checked against the registries they name, before anything starts.

``rollout.env_kwargs`` maps a domain to its environment's constructor arguments and ``sft.options``
goes to a demonstration source: neither is a fixed set of fields, so the typed loader cannot list
them. Unchecked, a misspelt domain was silently ignored, a misspelt keyword reached the
environment's constructor as a ``TypeError`` minutes into a run, and a misspelt option failed
only when the data loaded. Here each is a one-line :class:`ConfigError` naming the field.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from envs import DOMAINS  # importing envs registers the shipped domains and their demonstration sources
from envs.demonstrations import DEMONSTRATIONS, demonstration_options
from rl.config.errors import ConfigError, need, unknown_field_message


def constructor_parameters(cls: type) -> set[str]:
    """The keyword arguments ``cls(...)`` accepts: its ``__init__``'s, and its bases' while it passes ``**kwargs`` on."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass) or klass is object:
            continue
        params = list(inspect.signature(vars(klass)["__init__"]).parameters.values())[1:]  # without self
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


def check_env_kwargs(env_kwargs: Mapping[str, Any]) -> None:
    """Every key of ``rollout.env_kwargs`` is a registered domain, and its keys that domain's environment's
    constructor parameters."""
    for domain, kwargs in env_kwargs.items():
        if domain not in DOMAINS:
            raise ConfigError(unknown_field_message(f"rollout.env_kwargs.{domain}", DOMAINS, "registered domain"))
        need(isinstance(kwargs, Mapping), f"rollout.env_kwargs.{domain}", "a dict of constructor arguments", kwargs)
        accepted = constructor_parameters(DOMAINS[domain])
        for key in kwargs:
            if key not in accepted:
                what = f"argument of {DOMAINS[domain].__name__}"
                raise ConfigError(unknown_field_message(f"rollout.env_kwargs.{domain}.{key}", accepted, what))


def check_sft_options(data: str, options: Mapping[str, Any]) -> None:
    """Every key of ``sft.options`` is an option of the demonstration source ``sft.data`` names (a JSONL
    file takes none)."""
    known = demonstration_options(data) if data in DEMONSTRATIONS else {}
    for key in options:
        if key not in known:
            raise ConfigError(unknown_field_message(f"sft.options.{key}", known, f"option of sft.data={data!r}"))
