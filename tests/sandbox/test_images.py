"""Registry-free images: versioned tags, idempotent and concurrent builds, the same files on both backends."""

import os
import subprocess
import sys

import pytest

from sandbox import SandboxSpec, images
from tests.sandbox.conftest import backend_or_skip


def test_tag_is_versioned_by_the_recipe():
    assert images.DEFAULT_IMAGE == f"{images.IMAGE_REPOSITORY}:{images.IMAGE_VERSION}"
    assert len(images.IMAGE_VERSION) == 10
    assert images.rootfs_dir("a/b:c").name == "a_b-c"


def test_build_is_idempotent(capsys):
    backend_or_skip("docker")
    assert images.main(["build"]) == 0
    out = capsys.readouterr().out
    assert "already built" in out and "already present" in out
    assert images.main(["status"]) == 0
    assert "ready" in capsys.readouterr().out


@pytest.mark.parametrize(
    "tool", ["python3 -c 'import pytest, yaml'", "git --version", "patch --version", "jq --version"]
)
def test_image_tools_present_on_both_backends(backend, tool):
    with backend.create(SandboxSpec()) as sb:
        assert sb.exec(tool).exit_code == 0


def test_backends_see_the_same_root_filesystem():
    probe = "python3 -c 'import sys; print(sys.version)'; cat /etc/debian_version; ls /usr/bin | md5sum"
    outputs = []
    for name in ("bwrap", "docker"):
        with backend_or_skip(name).create(SandboxSpec()) as sb:
            outputs.append(sb.exec(probe).stdout)
    assert outputs[0] == outputs[1]


FAKE_DEBOOTSTRAP = """#!/bin/sh
# Stands in for debootstrap: records each run, takes a while, leaves a tiny root filesystem.
echo run >> "$AGENTRL_FAKE_RUNS"
[ -n "$AGENTRL_FAKE_FAIL" ] && { echo "E: $AGENTRL_FAKE_FAIL"; exit 1; }
target="$4"
mkdir -p "$target/etc" "$target/usr/bin"
echo "I: Retrieving Release"
sleep 2
echo root:x:0:0:root:/root:/bin/sh > "$target/etc/passwd"
"""


@pytest.fixture
def fake_build(tmp_path, monkeypatch):
    """``python -m sandbox.images build --no-docker`` with a fake debootstrap and a private rootfs home."""
    if os.geteuid() != 0:
        pytest.skip("builds need root")
    fake = tmp_path / "bin" / "debootstrap"
    fake.parent.mkdir()
    fake.write_text(FAKE_DEBOOTSTRAP)
    fake.chmod(0o755)
    env = dict(
        os.environ,
        PATH=f"{fake.parent}:{os.environ['PATH']}",
        AGENTRL_ROOTFS_DIR=str(tmp_path / "rootfs"),
        AGENTRL_FAKE_RUNS=str(tmp_path / "runs"),
    )
    tag = "agentrl-test/fake:1"

    def build(**extra):
        cmd = [sys.executable, "-m", "sandbox.images", "build", "--no-docker", "--tag", tag]
        return subprocess.Popen(cmd, env=dict(env, **extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    monkeypatch.setenv("AGENTRL_ROOTFS_DIR", env["AGENTRL_ROOTFS_DIR"])
    return build, tmp_path / "runs", images.rootfs_dir(tag)


def test_two_concurrent_builds_both_succeed_and_build_once(fake_build):
    build, runs, target = fake_build
    first, second = build(), build()
    results = [p.communicate(timeout=60) for p in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, results
    assert runs.read_text().splitlines() == ["run"]  # the second waited, then reused the first's result
    assert any("waiting for it" in out for out, _ in results)
    assert (target / ".agentrl-complete").exists()
    passwd = (target / "etc/passwd").read_text()
    assert "sandbox:x:1000:1000" in passwd and "judge:x:1001:1001" in passwd


def test_leftovers_with_mounts_are_unmounted_not_walked(fake_build):
    build, _, target = fake_build
    partial = target.with_name(target.name + ".partial")
    (partial / "proc").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(partial / "proc")], check=True)
    (partial / "proc" / "canary").write_text("a killed build's mount")
    try:
        proc = build()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert not images.mounts_under(partial) and not partial.exists()
    finally:
        subprocess.run(["umount", "--lazy", str(partial / "proc")], check=False, capture_output=True)


def test_a_failed_build_names_its_cause(fake_build):
    build, _, _ = fake_build
    proc = build(AGENTRL_FAKE_FAIL="Invalid Release signature (NOSPLIT)")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "could not be read or verified" in err and "Full log:" in err
