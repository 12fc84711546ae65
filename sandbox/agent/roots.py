"""The writable mount roots themselves: their xattrs, ACLs and times, kept as at boot (runs inside).

A reset empties each writable root (workspace, /tmp, /dev/shm, ...) and
restores its contents, but the root directory is a mount point and stays: what
a command sets *on it* would reach the next lease. As its owner, a command may
set ``user.*`` extended attributes and POSIX ACLs (``system.posix_acl_*``) on
the workspace root, and it may change the times of any root it can write
(``touch -d``, or creating files): each is a few bytes of message for the next
episode. So the agent records every root's attributes and times at boot,
before any command runs, puts them back after each restore, and reports them
for the warm pool's hygiene fingerprint.

ctime cannot be set by anyone; it says when the last reset happened, which the
next lease can tell without it. atime is reset but not fingerprinted: the
probe's own listing of a directory may update it (``relatime``).

Standard library only, Python >= 3.8 (see :mod:`sandbox.agent`).
"""

import hashlib
import os


def _xattrs(path):
    """{name: value} of every extended attribute of ``path`` the agent can read (never following links)."""
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:  # a filesystem without xattrs has none to carry a message
        return {}
    found = {}
    for name in names:
        try:
            found[name] = os.getxattr(path, name, follow_symlinks=False)
        except OSError:
            continue
    return found


class RootAttributes:
    """What each writable root carried at boot: extended attributes (ACLs included) and times."""

    def __init__(self, paths):
        self.boot = {}
        for path in paths:
            st = os.stat(path, follow_symlinks=False)
            self.boot[path] = (_xattrs(path), st.st_atime_ns, st.st_mtime_ns)

    def reset(self):
        """Every root's xattrs and times as at boot. Returns the problems (an empty list when all held)."""
        problems = []
        for path, (xattrs, atime_ns, mtime_ns) in sorted(self.boot.items()):
            for name in _xattrs(path):
                if name not in xattrs:
                    try:
                        os.removexattr(path, name, follow_symlinks=False)
                    except OSError as exc:
                        problems.append("%s: remove xattr %s: %s" % (path, name, exc.strerror))
            for name, value in xattrs.items():
                try:
                    os.setxattr(path, name, value, follow_symlinks=False)
                except OSError as exc:
                    problems.append("%s: set xattr %s: %s" % (path, name, exc.strerror))
            try:
                os.utime(path, ns=(atime_ns, mtime_ns), follow_symlinks=False)
            except OSError as exc:
                problems.append("%s: times: %s" % (path, exc.strerror))
        return problems

    def fingerprint(self):
        """[path, "root", mtime ns, sorted "name=sha256(value)"] per root, for the hygiene probe."""
        out = []
        for path in sorted(self.boot):
            try:
                mtime_ns = os.stat(path, follow_symlinks=False).st_mtime_ns
            except OSError as exc:
                out.append([path, "root", "stat failed: %s" % exc.strerror, []])
                continue
            digests = sorted(
                "%s=%s" % (name, hashlib.sha256(value).hexdigest()[:16]) for name, value in _xattrs(path).items()
            )
            out.append([path, "root", mtime_ns, digests])
        return out
