"""An environment in which git, run by the judge over the agent's repositories, runs nothing of the agent's.

The host bundles this module with the in-sandbox programs that run git on
files the agent wrote (the shell domain's ``state_checker.py`` for command
checks, the oracle scan of ``envs/quality/leak_probes.py``). A repository's own config can make git execute programs:
``core.fsmonitor``, hooks, ``gpg.program`` with ``log.showSignature``, filter
drivers (``status`` runs ``clean`` on changed files), diff drivers, an external
diff, aliases, transports. Run as the judge, such a program could write forged
output into the very command being checked (or kill git half-way, so that
``test -z "$(git status --porcelain)"`` sees nothing). So:

* git reads no system or global config (``GIT_CONFIG_NOSYSTEM``,
  ``GIT_CONFIG_GLOBAL=/dev/null``, ``HOME`` elsewhere), no system attributes,
  no replace refs or grafts, and takes no optional locks (``status`` then never
  writes the index, so no index hook can fire);
* :data:`FIXED` overrides, as command-line config (``GIT_CONFIG_COUNT``, read
  after every file, includes too), the settings with a fixed name that run a
  program, and the stat-trust and index settings (``core.trustctime``,
  ``core.checkStat``, ``core.ignoreStat``, split/sparse index, line-ending
  conversion) that could make ``status`` report a modified file as clean;
  ``safe.directory=*`` because the repositories belong to uid 1000;
* what config cannot reach is state in the index itself: assume-unchanged and
  skip-worktree bits, and stat data the agent's own git wrote. A check that
  means "the tree equals HEAD" must therefore compare against HEAD's blobs
  through a fresh index (``read-tree HEAD`` into a temporary ``GIT_INDEX_FILE``,
  which has no stat data to trust), as the shell tasks do;
* settings with an agent-chosen name (``filter.<x>.clean``, ``diff.<x>.textconv``,
  ``alias.<x>``, ``protocol.<x>.allow`` ...) are found by listing, with
  ``git config --list --name-only``, the config of every repository under the
  writable roots, and overridden one by one: filters become no-ops, the others
  fail when used (git then exits non-zero and the check fails closed).

If a repository cannot be listed (too many files to search, a config that
cannot be read), :class:`GitVetError` is raised and the caller fails every
check that runs git. Residual: a task command that runs a *different* program
which executes workspace files (``make``, ``python3 x.py``) is out of this
module's reach; command checks must only read the agent's files.
"""

import os
import re
import subprocess
import time

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GIT_BASE_ENV = {
    "PATH": SYSTEM_PATH,
    "LANG": "C.UTF-8",
    "HOME": "/nonexistent",
    "XDG_CONFIG_HOME": "/nonexistent",
    "TMPDIR": "/tmp",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_NO_REPLACE_OBJECTS": "1",
    "GIT_GRAFT_FILE": "/dev/null",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ALLOW_PROTOCOL": "none",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "GIT_EDITOR": "false",
    "EDITOR": "false",
    "VISUAL": "false",
    "GIT_ASKPASS": "false",
    "SSH_ASKPASS": "false",
    "GIT_SSH_COMMAND": "false",
}
FIXED = (
    ("safe.directory", "*"),
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("core.editor", "false"),
    ("sequence.editor", "false"),
    ("core.askPass", "false"),
    ("core.sshCommand", "false"),
    ("core.attributesFile", "/dev/null"),
    ("core.excludesFile", "/dev/null"),
    ("core.useReplaceRefs", "false"),
    ("core.untrackedCache", "false"),
    # every setting that makes status trust stat data or skip content: a modified file must never look clean
    ("core.ignoreStat", "false"),
    ("core.trustctime", "true"),
    ("core.checkStat", "default"),
    ("core.fileMode", "true"),
    ("core.symlinks", "true"),
    ("core.ignoreCase", "false"),
    ("core.splitIndex", "false"),
    ("core.sparseCheckout", "false"),
    ("core.autocrlf", "false"),
    ("core.eol", "lf"),
    ("core.safecrlf", "false"),
    ("index.sparse", "false"),
    ("index.skipHash", "false"),
    ("feature.manyFiles", "false"),
    ("gpg.program", "false"),
    ("gpg.openpgp.program", "false"),
    ("gpg.x509.program", "false"),
    ("gpg.ssh.program", "false"),
    ("log.showSignature", "false"),
    ("status.showUntrackedFiles", "normal"),
    ("status.submoduleSummary", "false"),
    ("submodule.recurse", "false"),
    ("protocol.allow", "never"),
    ("credential.helper", ""),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("help.autocorrect", "0"),
    ("advice.graftFileDeprecated", "false"),
)
# Agent-named settings that run a program -> the value that disarms them.
_NAMED = (
    (re.compile(r"^filter\..+\.(clean|smudge|process)$"), ""),  # empty: no filtering
    (re.compile(r"^filter\..+\.required$"), "false"),
    (re.compile(r"^diff\..+\.(textconv|command)$"), ""),  # empty: git fails when it would run it
    (re.compile(r"^diff\.external$"), ""),
    (re.compile(r"^(merge|difftool|mergetool)\..+\.(driver|cmd|path)$"), ""),
    (re.compile(r"^alias\..+$"), ""),
    (re.compile(r"^protocol\..+\.allow$"), "never"),
    (re.compile(r"^credential\..+\.helper$"), ""),
    (re.compile(r"^gpg\..+\.program$"), "false"),
    (re.compile(r"^submodule\..+\.update$"), "none"),
)
MAX_ENTRIES = 200000
MAX_REPOS = 64
MAX_SECONDS = 15.0


class GitVetError(Exception):
    """The repositories under the roots could not be vetted: git must not run."""


def walk(root):
    """(dir, subdirs, files) like ``os.walk`` without following links, iteratively (any depth), errors skipped."""
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                entries = list(it)
        except OSError:
            continue
        dirs = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        files = [e.name for e in entries if not e.is_dir(follow_symlinks=False)]
        yield d, dirs, files
        stack.extend(os.path.join(d, name) for name in reversed(dirs))


def find_git_dirs(roots):
    """[(how, path)]: ``("git-dir", d)`` for repository directories, ``("work-tree", d)`` for ``.git`` files."""
    found, seen, start = [], 0, time.monotonic()
    for root in roots:
        for d, dirs, files in walk(root):
            seen += len(dirs) + len(files)
            if seen > MAX_ENTRIES or time.monotonic() - start > MAX_SECONDS:
                raise GitVetError(f"more than {MAX_ENTRIES} entries to search for repositories")
            names = set(dirs) | set(files)  # a link counts too: git follows it
            if ".git" in names:
                found.append(("work-tree", d))
            if "HEAD" in names and ({"objects", "refs"} <= names or "commondir" in names):
                found.append(("git-dir", d))
                dirs[:] = [x for x in dirs if x != "objects"]
            if len(found) > MAX_REPOS:
                raise GitVetError(f"more than {MAX_REPOS} repositories")
    return found


def _config(pairs):
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for i, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def configured_names(how, path, env, deadline):
    """The config keys git sees in one repository (includes followed), listed by git without running anything."""
    where = ["--git-dir", path] if how == "git-dir" else ["-C", path]
    try:
        proc = subprocess.run(
            ["git", *where, "config", "--list", "--name-only", "-z"],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=max(0.1, min(5.0, deadline - time.monotonic())),
        )
    except subprocess.TimeoutExpired:
        raise GitVetError(f"listing the config of {path} timed out") from None
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", "replace").strip()[-200:]
        raise GitVetError(f"cannot list the config of {path}: {tail}")
    return [name for name in proc.stdout.decode("utf-8", "replace").split("\0") if name]


def git_env(roots):
    """The environment for commands that may run git over repositories under ``roots``."""
    base = dict(GIT_BASE_ENV, **_config(FIXED))
    overrides, deadline = {}, time.monotonic() + MAX_SECONDS
    for how, path in find_git_dirs(roots):
        for name in configured_names(how, path, base, deadline):
            for pattern, value in _NAMED:
                if pattern.match(name):
                    overrides[name] = value
    return dict(GIT_BASE_ENV, **_config(list(FIXED) + sorted(overrides.items())))
