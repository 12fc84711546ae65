"""The agent's file operations on directories that commands control.

Runs inside the sandbox (standard library, Python >= 3.8). The agent holds
capabilities its commands do not, so every path a command could have shaped
is walked one component at a time from the root's descriptor with
``O_NOFOLLOW``: a symlink planted at ``/workspace/x -> /proc/self/fd/1``, a
directory swapped for a link mid-walk, or a FIFO where a file was expected
cannot turn the agent into a confused deputy that writes into its own reply
stream, reads its own memory, or blocks forever. Writes go to a new file
that is renamed into place, so whatever the command left at the path is
replaced, never followed.
"""

import errno
import io
import os
import stat
import tarfile

O_WALK = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
O_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class FileOpError(Exception):
    """A file operation the host asked for cannot be done (reported to it as a file error)."""


def _parts(relative):
    parts = [p for p in relative.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise FileOpError("path component '.' or '..' in %r" % relative)
    return parts


class Trees:
    """The writable directories of the sandbox: ``[{"path", "uid", "gid", "mode", "snapshot"}]``."""

    def __init__(self, roots):
        self.roots = sorted(roots, key=lambda r: -len(r["path"]))  # longest first: /dev/shm before /dev

    @property
    def paths(self):
        return [r["path"] for r in self.roots]

    def locate(self, path):
        """(root, [components below it]) for an absolute path inside one of the roots."""
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
            raise FileOpError("bad path %r" % (path,))
        norm = os.path.normpath(path)
        for root in self.roots:
            base = root["path"]
            if norm == base or norm.startswith(base.rstrip("/") + "/"):
                return root, _parts(norm[len(base) :])
        raise FileOpError("%s is not inside a writable directory (%s)" % (path, ", ".join(self.paths)))

    # -- walking ------------------------------------------------------------
    def open_dir(self, root, parts, create_owner=None):
        """A descriptor of root/parts, never through a symlink; missing dirs made when ``create_owner``."""
        fd = os.open(root["path"], O_WALK)
        try:
            for name in parts:
                try:
                    nxt = os.open(name, O_WALK, dir_fd=fd)
                except FileNotFoundError:
                    if create_owner is None:
                        raise
                    os.mkdir(name, 0o755, dir_fd=fd)
                    nxt = os.open(name, O_WALK, dir_fd=fd)
                    os.fchown(nxt, *create_owner)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise FileOpError("%s is not a directory (a symlink or a file)" % name) from exc
                    raise
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    # -- host requests ------------------------------------------------------
    def read(self, path, limit):
        root, parts = self.locate(path)
        if not parts:
            raise FileOpError("%s is a directory" % path)
        dir_fd = self.open_dir(root, parts[:-1])
        try:
            try:
                fd = os.open(parts[-1], O_READ, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise FileOpError("%s is a symlink; not followed" % path) from exc
                raise
        finally:
            os.close(dir_fd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise FileOpError("%s is not a regular file" % path)
            chunks, size = [], 0
            while size <= limit:
                chunk = os.read(fd, min(1 << 20, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
        data = b"".join(chunks)
        if len(data) > limit:
            raise FileOpError("%s is larger than max_bytes=%d" % (path, limit))
        return data

    def write(self, path, data, mode, uid, gid):
        root, parts = self.locate(path)
        if not parts:
            raise FileOpError("%s is a directory" % path)
        dir_fd = self.open_dir(root, parts[:-1], create_owner=(uid, gid))
        tmp = ".agentrl-write-" + os.urandom(12).hex()  # unguessable: a command cannot pre-plant it
        try:
            fd = os.open(tmp, O_CREATE, 0o600, dir_fd=dir_fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fchown(fd, uid, gid)
                os.fchmod(fd, mode & 0o7777)
            finally:
                os.close(fd)
            try:
                os.rename(tmp, parts[-1], src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except OSError:
                os.unlink(tmp, dir_fd=dir_fd)
                raise
        finally:
            os.close(dir_fd)

    # -- snapshot / restore ---------------------------------------------------
    def snapshot(self, out):
        """Writes a tar of every root marked for snapshots to ``out`` (a :class:`ChunkWriter`).

        Walked by descriptor (no symlink followed, no recursion); ``out`` flushes it in bounded chunks.
        """
        roots = [r for r in sorted(self.roots, key=lambda r: r["path"]) if r.get("snapshot", True)]
        budget = _Budget(sum(_capacity(r["path"]) for r in roots))
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for root in roots:
                base = root["path"].lstrip("/")
                tar.addfile(_info(base, os.stat(root["path"], follow_symlinks=False)))
                for prefix, names, dfd in walk(root["path"], base):
                    for name in names:
                        _add(tar, prefix + "/" + name, name, dfd, budget)
        out.flush()

    def clear(self):
        """Empties every root (the roots themselves stay: they are mount points); any depth, no recursion."""
        for root in self.roots:
            remove_children(root["path"])

    def restore(self, data):
        """Recreates a :meth:`snapshot` into emptied roots, every entry created anew (never followed)."""
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            for member in tar:
                root, parts = self.locate("/" + member.name)
                if not parts:
                    if member.isdir():
                        os.chown(root["path"], member.uid, member.gid, follow_symlinks=False)
                        os.chmod(root["path"], member.mode & 0o7777)
                    continue
                dir_fd = self.open_dir(root, parts[:-1], create_owner=(root["uid"], root["gid"]))
                try:
                    _create(tar, member, parts[-1], dir_fd)
                finally:
                    os.close(dir_fd)

    def listing(self, limit):
        """[path, kind (d/f/l/o), size of files, mode, uid] of everything under the roots.

        Returns (entries, complete): at most ``limit`` entries, and ``complete`` False when the limit or
        the depth cap cut the listing short (the pool then treats the sandbox as not clean).
        """
        entries = []
        try:
            for root in self.roots:
                for prefix, names, dfd in walk(root["path"], root["path"]):
                    for name in names:
                        try:
                            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                        except OSError:
                            continue
                        mode = st.st_mode
                        kind = "d" if stat.S_ISDIR(mode) else "l" if stat.S_ISLNK(mode) else "f"
                        kind = kind if kind != "f" or stat.S_ISREG(mode) else "o"
                        size = st.st_size if kind == "f" else 0
                        entries.append([prefix + "/" + name, kind, size, stat.S_IMODE(mode), st.st_uid])
                        if len(entries) > limit:
                            return entries[:limit], False
        except FileOpError:
            return entries[:limit], False
        return entries, True


MAX_DEPTH = 256  # deeper trees are refused by snapshot and listing (a command can nest dirs without end)


def walk(top, label):
    """Yields (label/relative dir, sorted names, dir fd) for every directory under ``top``, top-down.

    Iterative and descriptor-based: never follows a symlink, never recurses in Python, holds at most
    ``MAX_DEPTH`` descriptors. :class:`FileOpError` past that depth.
    """
    stack = [(os.open(top, O_WALK), label, 0)]
    try:
        while stack:
            fd, prefix, depth = stack.pop()
            try:
                with os.scandir(fd) as it:
                    items = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
                yield prefix, [name for name, _ in items], fd
                subdirs = [name for name, is_dir in items if is_dir]
                if subdirs and depth + 1 > MAX_DEPTH:
                    raise FileOpError("%s: directories nested deeper than %d levels" % (label, MAX_DEPTH))
                for name in reversed(subdirs):
                    try:
                        stack.append((os.open(name, O_WALK, dir_fd=fd), prefix + "/" + name, depth + 1))
                    except OSError:
                        continue  # swapped for a non-directory since the listing
            finally:
                os.close(fd)
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def remove_children(top):
    """Deletes everything under ``top`` at any depth, iteratively, climbing back with ``..``.

    Only called with every process of the sandbox dead, so nothing can move a directory meanwhile.
    """
    fd = os.open(top, O_WALK)
    names = []  # the path from top to the directory ``fd`` is open on
    try:
        while True:
            subdir = None
            with os.scandir(fd) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        subdir = subdir or entry.name
                    else:
                        try:
                            os.unlink(entry.name, dir_fd=fd)
                        except FileNotFoundError:
                            pass
            if subdir is not None:
                child = os.open(subdir, O_WALK, dir_fd=fd)
                os.close(fd)
                fd = child
                names.append(subdir)
                continue
            if not names:
                return
            parent = os.open("..", O_WALK, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)


class ChunkWriter:
    """A write-only file that hands its bytes to ``send`` in chunks of ``chunk`` bytes, up to ``limit`` in all.

    What keeps a snapshot from costing the agent (inside the sandbox's memory limit) more than one
    chunk, and the host more than ``limit``: past it, :class:`FileOpError` names the cap and the size
    reached, which the host raises as a file error, never an OOM-killed agent.
    """

    def __init__(self, send, chunk, limit):
        self.send, self.chunk, self.limit = send, chunk, limit
        self.buf, self.total = bytearray(), 0

    def write(self, data):
        self.total += len(data)
        if self.total > self.limit:
            raise FileOpError("larger than max_bytes=%d (%d bytes reached)" % (self.limit, self.total))
        self.buf += data
        while len(self.buf) >= self.chunk:
            self.send(bytes(self.buf[: self.chunk]))
            del self.buf[: self.chunk]
        return len(data)

    def tell(self):
        return self.total

    def flush(self):
        if self.buf:
            self.send(bytes(self.buf))
            self.buf.clear()


def _info(name, st):
    info = tarfile.TarInfo(name)
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid = st.st_uid, st.st_gid
    info.mtime = int(st.st_mtime)
    info.type = tarfile.DIRTYPE
    return info


class _Exactly(io.RawIOBase):
    """``size`` bytes of a file that may change while it is read: cut or zero-padded, never short."""

    def __init__(self, fd, size):
        self.fd, self.left = fd, size

    def readable(self):
        return True

    def readinto(self, b):
        if self.left <= 0:
            return 0
        n = min(len(b), self.left)
        chunk = os.read(self.fd, n) or bytes(n)
        b[: len(chunk)] = chunk
        self.left -= len(chunk)
        return len(chunk)


# A file may have this much more apparent size than it has blocks (tmpfs rounds to pages) and still
# count as dense; a sparser one is refused: its holes would become real bytes in the tar.
SPARSE_SLACK = 1 << 16


def _capacity(path):
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


class _Budget:
    """What a snapshot may carry in all: the capacity of the mounts it copies.

    Real data can never exceed the mounts' size; only holes (sparse files) and hard links (one file
    stored once per name) can. Refusing them here, before any byte is read, fails fast with the
    file's name; the :class:`ChunkWriter`'s cap bounds what is sent either way.
    """

    def __init__(self, limit):
        self.limit, self.used = limit, 0

    def take(self, path, size, allocated):
        if size > allocated + SPARSE_SLACK:
            raise FileOpError(
                "snapshot: %s is sparse (%d bytes apparent, %d allocated); snapshots refuse sparse files"
                % (path, size, allocated)
            )
        self.used += size
        if self.used > self.limit:
            raise FileOpError(
                "snapshot: more than %d bytes of file data (the writable mounts' size; hard links?)" % self.limit
            )


def _add(tar, arcname, name, dir_fd, budget):
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return
    info = tarfile.TarInfo(arcname)
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid = st.st_uid, st.st_gid
    info.mtime = int(st.st_mtime)
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(name, dir_fd=dir_fd)
        tar.addfile(info)
    elif stat.S_ISFIFO(st.st_mode):
        info.type = tarfile.FIFOTYPE
        tar.addfile(info)
    elif stat.S_ISREG(st.st_mode):
        try:
            fd = os.open(name, O_READ, dir_fd=dir_fd)
        except OSError:
            return
        try:
            now = os.fstat(fd)
            if not stat.S_ISREG(now.st_mode):
                return  # swapped for something else since the stat
            budget.take("/" + arcname, st.st_size, max(now.st_blocks, st.st_blocks) * 512)
            info.size = st.st_size
            tar.addfile(info, io.BufferedReader(_Exactly(fd, st.st_size)))
        finally:
            os.close(fd)
    # sockets and device nodes are not carried over


def _create(tar, member, name, dir_fd):
    mode = member.mode & 0o7777
    if member.isdir():
        os.mkdir(name, 0o700, dir_fd=dir_fd)
        fd = os.open(name, O_WALK, dir_fd=dir_fd)
        try:
            os.fchown(fd, member.uid, member.gid)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        return
    if member.isfile():
        fd = os.open(name, O_CREATE, 0o600, dir_fd=dir_fd)
        try:
            src = tar.extractfile(member)
            while True:
                chunk = src.read(1 << 20)
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            os.fchown(fd, member.uid, member.gid)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    elif member.issym():
        os.symlink(member.linkname, name, dir_fd=dir_fd)
    elif member.isfifo():
        os.mkfifo(name, 0o600, dir_fd=dir_fd)
        os.chmod(name, mode, dir_fd=dir_fd)  # a FIFO this call just made: nothing to follow
    else:
        return
    os.chown(name, member.uid, member.gid, dir_fd=dir_fd, follow_symlinks=False)
    os.utime(name, (member.mtime, member.mtime), dir_fd=dir_fd, follow_symlinks=False)
