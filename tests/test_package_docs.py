"""Each package's docstring is its map: it names every module the package holds, and names
none that is gone. A reader starts there, so a map that lies sends them to the wrong file.

Packages whose docstring lists modules (``:mod:`pkg.mod```) are held to the whole list.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPED = (
    "rl",
    "rl.config",
    "rl.generation",
    "rl.learning",
    "rl.models",
    "rl.phases",
    "rl.results",
    "rl.rollout",
    "rl.run",
)


def _submodules(package: str) -> set[str]:
    folder = ROOT.joinpath(*package.split("."))
    return {
        f"{package}.{p.stem if p.is_file() else p.name}"
        for p in folder.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }


def _named(package: str) -> set[str]:
    doc = ast.get_docstring(ast.parse(ROOT.joinpath(*package.split("."), "__init__.py").read_text())) or ""
    names = set(re.findall(r":mod:`([\w.]+)`", doc))
    depth = package.count(".") + 1
    return {".".join(n.split(".")[: depth + 1]) for n in names if n.startswith(package + ".")}


@pytest.mark.parametrize("package", MAPPED)
def test_the_package_docstring_names_exactly_the_modules_it_holds(package):
    held, named = _submodules(package), _named(package)
    assert sorted(held - named) == [], f"{package}'s docstring omits these modules"
    assert sorted(named - held) == [], f"{package}'s docstring names modules that do not exist"
