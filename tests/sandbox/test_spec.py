"""SandboxSpec / ExecResult validation: bad input names the field and what was expected."""

import math

import pytest

from sandbox import ExecResult, SandboxSpec, SandboxUsageError, get_backend


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("image", "", "image"),
        ("cpus", 0, "cpus"),
        ("cpus", math.nan, "cpus"),
        ("memory_mb", "1g", "memory_mb"),
        ("memory_mb", True, "memory_mb"),
        ("pids", 1, "pids"),
        ("timeout_s", -1, "timeout_s"),
        ("timeout_s", math.inf, "timeout_s"),
        ("max_output_bytes", 0, "max_output_bytes"),
        ("network", "yes", "network"),
        ("workdir", "relative", "workdir"),
        ("workdir", "/", "workdir"),
        ("workdir", "/a/../b", "workdir"),
        ("env", {"A=B": "x"}, "env"),
        ("env", {"A": 3}, "env"),
        ("env", ["A"], "env"),
    ],
)
def test_bad_field_is_named(field, value, needle):
    with pytest.raises(SandboxUsageError, match=needle):
        SandboxSpec(**{field: value})


def test_memory_must_cover_tmpfs():
    with pytest.raises(SandboxUsageError, match=r"memory_mb.*workspace_mb \+ 2 \* tmp_mb"):
        SandboxSpec(memory_mb=128, workspace_mb=128)
    assert SandboxSpec(memory_mb=512, workspace_mb=256, tmp_mb=64).memory_mb == 512


def test_spec_is_frozen_and_replace_revalidates():
    spec = SandboxSpec()
    with pytest.raises(AttributeError):
        spec.cpus = 2  # type: ignore[misc]
    assert spec.replace(cpus=2).cpus == 2
    with pytest.raises(SandboxUsageError, match="cpus"):
        spec.replace(cpus=-1)


def test_env_is_copied():
    env = {"A": "1"}
    spec = SandboxSpec(env=env)
    env["A"] = "2"
    assert spec.env == {"A": "1"}


def test_exec_result_text_never_raises_on_binary():
    r = ExecResult(exit_code=0, stdout=b"\xff\xfeok", stderr=b"")
    assert r.ok
    assert r.stdout_text.endswith("ok")
    assert r.to_dict()["stdout"].endswith("ok")


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(SandboxUsageError, match="backend: expected one of"):
        get_backend("podman")
