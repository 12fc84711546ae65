"""Sandbox images built with no registry: debootstrap a root filesystem, `docker import` it.

The root filesystem stays on disk next to the image, so the bwrap backend runs
on exactly the files the Docker image holds. The tag's version is a hash of
the recipe, so a changed package list makes a new tag and nothing stale is
reused; building an existing tag does nothing. Builds of one tag take a file
lock: a second build (another user, a test fixture) waits and reuses the
result, and a build never deletes a tree that still has mounts under it.

    python -m sandbox.images build             # rootfs + docker image (idempotent)
    python -m sandbox.images build --no-docker # rootfs only (bwrap on a Docker-less machine)
    python -m sandbox.images status
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
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
RECIPE_REVISION = 2  # bump when the build steps below change
# The unprivileged accounts of every sandbox (see sandbox.identity): commands and the judge.
ACCOUNTS = (("sandbox", 1000, "/workspace", "/bin/bash"), ("judge", 1001, "/nonexistent", "/usr/sbin/nologin"))
IMAGE_VERSION = hashlib.sha256(repr((SUITE, PACKAGES, RECIPE_REVISION, ACCOUNTS)).encode()).hexdigest()[:10]
IMAGE_REPOSITORY = "agentrl-sandbox"
DEFAULT_IMAGE = f"{IMAGE_REPOSITORY}:{IMAGE_VERSION}"
BUILD_COMMAND = "python -m sandbox.images build"
_COMPLETE = ".agentrl-complete"
# Where root keeps root filesystems: bwrap runs as an unprivileged uid and must be able to reach them
# (root's own ~/.cache sits under /root, mode 0700).
ROOT_ROOTFS_HOME = Path("/var/cache/agentrl/rootfs")


def rootfs_home() -> Path:
    if "AGENTRL_ROOTFS_DIR" in os.environ:
        return Path(os.environ["AGENTRL_ROOTFS_DIR"])
    if os.geteuid() == 0:
        return ROOT_ROOTFS_HOME
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "agentrl" / "rootfs"


def rootfs_dir(tag: str = DEFAULT_IMAGE) -> Path:
    """Where the root filesystem of ``tag`` lives (whether built or not)."""
    return rootfs_home() / tag.replace("/", "_").replace(":", "-")


def rootfs_ready(tag: str = DEFAULT_IMAGE) -> bool:
    return (rootfs_dir(tag) / _COMPLETE).exists()


def _log(msg: str, start: float) -> None:
    print(f"[images {time.monotonic() - start:6.1f}s] {msg}", flush=True)


@contextlib.contextmanager
def build_lock(tag: str):
    """One build of ``tag`` at a time on this machine; the second waits for the first and reuses its result."""
    home = rootfs_home()
    home.mkdir(parents=True, exist_ok=True)
    path = home / f".{rootfs_dir(tag).name}.lock"
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"[images] another build of {tag} is running; waiting for it ({path})", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` (deepest first), from /proc/self/mountinfo."""
    root = os.path.realpath(path)
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == root or point.startswith(root.rstrip("/") + "/"):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def remove_tree(path: Path) -> None:
    """``rmtree`` that first unmounts what a killed debootstrap left mounted inside (its /proc, /sys)."""
    if not path.exists():
        return
    for point in mounts_under(path):
        subprocess.run(["umount", "--lazy", point], check=False, capture_output=True)
    left = mounts_under(path)
    if left:
        raise RuntimeError(f"cannot remove {path}: still mounted: {', '.join(left)}")
    shutil.rmtree(path)


def build_rootfs(tag: str = DEFAULT_IMAGE, *, mirror: str = MIRROR, force: bool = False) -> Path:
    """Debootstraps the root filesystem of ``tag``; a complete one is reused."""
    with build_lock(tag):
        return _build_rootfs(tag, mirror=mirror, force=force)


def _build_rootfs(tag: str, *, mirror: str, force: bool) -> Path:
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
    remove_tree(partial)  # a killed build's leftovers (we hold the lock: no build is running there)
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
        raise RuntimeError(_explain_failure(tail, partial, mirror))
    _finish_rootfs(partial)
    remove_tree(target)
    partial.rename(target)
    (target / _COMPLETE).write_text(tag + "\n")
    _log(f"rootfs ready at {target}", start)
    return target


def _explain_failure(tail: list[str], partial: Path, mirror: str) -> str:
    text = "\n".join(tail)
    log = partial / "debootstrap" / "debootstrap.log"
    if "Release signature" in text or "Failed getting release file" in text:
        cause = f"the mirror {mirror} could not be read or verified (network, proxy, or a mirror mid-sync)"
    elif "Couldn't download" in text or "Failed to fetch" in text:
        cause = f"packages could not be downloaded from {mirror}"
    elif "No space left" in text:
        cause = f"the disk under {partial} is full"
    else:
        cause = "see the output below"
    return f"debootstrap failed: {cause}. Full log: {log}\n{text}"


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
    (root / "workspace").chmod(0o755)
    (root / "etc/hostname").write_text("sandbox\n")
    for name, uid, home, shell in ACCOUNTS:
        with open(root / "etc/passwd", "a") as f:
            f.write(f"{name}:x:{uid}:{uid}:agentrl {name}:{home}:{shell}\n")
        with open(root / "etc/group", "a") as f:
            f.write(f"{name}:x:{uid}:\n")


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
            with build_lock(args.tag):
                import_image(args.tag, url=args.docker_url, force=args.force)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(args.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
