"""Registry-free images: versioned tags, idempotent builds, the same files on both backends."""

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
