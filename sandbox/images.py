"""Sandbox images built with no registry: debootstrap a root filesystem, `docker import` it.

The root filesystem stays on disk next to the image, so the bwrap backend runs
on exactly the files the Docker image holds. The tag's version is a hash of
the recipe, so a changed package list makes a new tag and nothing stale is
reused; building an existing tag does nothing.

    python -m sandbox.images build             # rootfs + docker image (idempotent)
    python -m sandbox.images build --no-docker # rootfs only (bwrap on a Docker-less machine)
    python -m sandbox.images status
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

SUITE = "bookworm"
MIRROR = os.environ.get("AGENTRL_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What code inside a sandbox can count on, on both backends.
PACKAGES = (
    "python3",
    "python3-pytest",
    "python3-yaml",
    "git",
    "procps",
    "psmisc",
    "patch",
    "diffutils",
    "findutils",
    "grep",
    "sed",
    "gawk",
    "jq",
    "bc",
    "file",
    "sqlite3",
    "netcat-openbsd",
    "curl",
    "ca-certificates",
    "cron",
)
RECIPE_REVISION = 1  # bump when the build steps below change
IMAGE_VERSION = hashlib.sha256(repr((SUITE, PACKAGES, RECIPE_REVISION)).encode()).hexdigest()[:10]
IMAGE_REPOSITORY = "agentrl-sandbox"
DEFAULT_IMAGE = f"{IMAGE_REPOSITORY}:{IMAGE_VERSION}"
BUILD_COMMAND = "python -m sandbox.images build"
_COMPLETE = ".agentrl-complete"


def rootfs_home() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "agentrl" / "rootfs"
    return Path(os.environ.get("AGENTRL_ROOTFS_DIR", default))


def rootfs_dir(tag: str = DEFAULT_IMAGE) -> Path:
    """Where the root filesystem of ``tag`` lives (whether built or not)."""
    return rootfs_home() / tag.replace("/", "_").replace(":", "-")


def rootfs_ready(tag: str = DEFAULT_IMAGE) -> bool:
    return (rootfs_dir(tag) / _COMPLETE).exists()


def _log(msg: str, start: float) -> None:
    print(f"[images {time.monotonic() - start:6.1f}s] {msg}", flush=True)


def build_rootfs(tag: str = DEFAULT_IMAGE, *, mirror: str = MIRROR, force: bool = False) -> Path:
    """Debootstraps the root filesystem of ``tag``; a complete one is reused."""
    start = time.monotonic()
    target = rootfs_dir(tag)
    if rootfs_ready(tag) and not force:
        _log(f"rootfs {target} already built", start)
        return target
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed: apt-get install -y debootstrap")
    if os.geteuid() != 0:
        raise RuntimeError("building the root filesystem needs root (debootstrap)")
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(PACKAGES)}",
        SUITE,
        str(partial),
        mirror,
    ]
    _log(f"debootstrap {SUITE} with {len(PACKAGES)} extra packages into {partial}", start)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    counts = {"Retrieving": 0, "Unpacking": 0, "Configuring": 0}
    last = 0.0
    tail: list[str] = []
    for line in proc.stdout:
        tail = [*tail[-19:], line.rstrip()]
        for key in counts:
            if line.startswith(f"I: {key}"):
                counts[key] += 1
        if time.monotonic() - last > 5:
            last = time.monotonic()
            _log(
                "retrieved {Retrieving}, unpacked {Unpacking}, configured {Configuring} packages".format(**counts),
                start,
            )
    if proc.wait() != 0:
        raise RuntimeError("debootstrap failed:\n" + "\n".join(tail))
    _finish_rootfs(partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    (target / _COMPLETE).write_text(tag + "\n")
    _log(f"rootfs ready at {target}", start)
    return target


def _finish_rootfs(root: Path) -> None:
    """Slims the tree and adds the mount points sandboxes need."""
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale"):
        path = root / sub
        if path.is_dir():
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                elif child.name != "lock":
                    child.unlink(missing_ok=True)
    for sub in ("workspace", "run/agentrl"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "workspace").chmod(0o1777)
    (root / "etc/hostname").write_text("sandbox\n")


def docker_client(url: str | None = None):
    import docker

    return docker.DockerClient(base_url=url, version="auto") if url else docker.from_env(version="auto")


def image_exists(tag: str = DEFAULT_IMAGE, url: str | None = None) -> bool:
    import docker.errors

    try:
        docker_client(url).images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def import_image(tag: str = DEFAULT_IMAGE, *, url: str | None = None, force: bool = False) -> str:
    """``docker import``s the root filesystem of ``tag`` (through the Engine API)."""
    start = time.monotonic()
    client = docker_client(url)
    if not force and image_exists(tag, url):
        _log(f"image {tag} already present", start)
        return tag
    root = rootfs_dir(tag)
    if not rootfs_ready(tag):
        raise RuntimeError(f"root filesystem for {tag} is missing: run `{BUILD_COMMAND}`")
    repository, _, version = tag.rpartition(":")
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "rootfs.tar"
        _log(f"archiving {root}", start)
        with tarfile.open(archive, "w") as tar:
            for child in sorted(root.iterdir()):
                if child.name != _COMPLETE:
                    tar.add(child, arcname=child.name)
        _log(f"importing {archive.stat().st_size / 1e6:.0f} MB as {tag}", start)
        client.api.import_image_from_file(str(archive), repository=repository, tag=version)
    _log(f"image {tag} ready", start)
    return tag


def ensure(tag: str = DEFAULT_IMAGE, *, docker: bool = True, url: str | None = None) -> None:
    """Builds whatever of the rootfs / image is missing."""
    if docker and image_exists(tag, url) and rootfs_ready(tag):
        return
    build_rootfs(tag)
    if docker:
        import_image(tag, url=url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.images", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build the rootfs and import the Docker image (idempotent)")
    build.add_argument("--tag", default=DEFAULT_IMAGE)
    build.add_argument("--no-docker", action="store_true", help="only the rootfs, for the bwrap backend")
    build.add_argument("--docker-url", default=None, help="daemon to import into (default: DOCKER_HOST or local)")
    build.add_argument("--force", action="store_true", help="rebuild even if present")
    status = sub.add_parser("status", help="show whether the rootfs and the image exist")
    status.add_argument("--tag", default=DEFAULT_IMAGE)
    args = parser.parse_args(argv)
    if args.command == "status":
        print(f"tag:    {args.tag}")
        print(f"rootfs: {rootfs_dir(args.tag)} ({'ready' if rootfs_ready(args.tag) else 'missing'})")
        try:
            print(f"docker: {'present' if image_exists(args.tag) else 'missing'}")
        except Exception as exc:  # noqa: BLE001 - report, don't crash, on a Docker-less machine
            print(f"docker: unreachable ({exc.__class__.__name__})")
        return 0
    try:
        build_rootfs(args.tag, force=args.force)
        if not args.no_docker:
            import_image(args.tag, url=args.docker_url, force=args.force)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(args.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
