"""A kernel that lets a planted /tmp link redirect the judge's writes gets no sandbox, and is told why."""

from __future__ import annotations

import pytest

from sandbox.backends.link_protection import REQUIRED, require_link_protections, weak_link_protections
from sandbox.errors import BackendUnavailable


def _knobs(tmp_path, **values):
    for name, need in REQUIRED.items():
        (tmp_path / name).write_text(f"{values.get(name, need)}\n")
    return tmp_path


def test_a_kernel_with_every_protection_passes(tmp_path):
    assert weak_link_protections(_knobs(tmp_path)) == {}
    require_link_protections("bwrap", _knobs(tmp_path))


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_each_weak_knob_refuses_the_backend_and_names_the_fix(tmp_path, name):
    with pytest.raises(BackendUnavailable) as exc:
        require_link_protections("bwrap", _knobs(tmp_path, **{name: 0}))
    assert f"fs.{name}=0 (need {REQUIRED[name]})" in str(exc.value) and "system_setup.sh" in str(exc.value)


def test_an_unreadable_knob_counts_as_off(tmp_path):
    _knobs(tmp_path)
    (tmp_path / "protected_fifos").unlink()
    assert weak_link_protections(tmp_path) == {"protected_fifos": 0}


def test_this_host_is_set_up_as_the_setup_script_leaves_it():
    assert weak_link_protections() == {}, "run scripts/system_setup.sh"
