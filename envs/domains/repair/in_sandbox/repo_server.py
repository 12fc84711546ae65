"""Serves the repository under test to the judge: runs as the sandbox user, holds nothing that decides a reward.

agentrl starts it after killing every process the agent left and cleaning the
workspace::

    python3 -I -B repo_server.py SOCKET IMPORT_ROOT...

It listens on a unix socket, accepts the judge's one connection, and only then
puts the import roots on ``sys.path``. Each request imports a module of the
repository, reads or sets an attribute, calls something, or applies ``len``,
``bool``, ``iter``, ``next``, ``in`` or ``[]`` to an object; the reply is the
result as plain data (``plain_data``), or a handle when it is not plain data, or
the exception it raised (its class names and message). Arguments that the
judge passes are plain data (lists and dicts the call mutated travel back), or
handles of objects from here, or callables of the judge's own, which call back
over the same connection.

Everything in this process is the candidate's to change: the code under test
runs here and may patch, forge or kill anything. That is the design. The hidden
tests, their expected values and the verdict live in the judge's process,
under another uid; all this process can do is answer, with values.
"""

import builtins
import importlib
import os
import socket
import sys

if __package__:  # imported on the host, as part of envs
    from envs.domains.repair.in_sandbox.repo_wire import MUTABLE, WireError, recv, send
    from envs.in_sandbox.plain_data import PlainDataError, decode, encode
else:  # run from its directory, beside repo_wire.py and plain_data.py (not on the path of the code under test)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from plain_data import PlainDataError, decode, encode
    from repo_wire import MUTABLE, WireError, recv, send

    del sys.path[0]


def _name(cls):
    try:
        return f"{type.__getattribute__(cls, '__module__')}.{type.__getattribute__(cls, '__qualname__')}"
    except Exception:
        return "?"


def _mro(cls):
    try:
        return [_name(c) for c in type.__getattribute__(cls, "__mro__")]
    except Exception:
        return [_name(cls)]


def describe(obj):
    """What the judge needs to know about a handle: its type's name, and the MRO if it is an exception class."""
    cls = type(obj)
    info = {"type": _name(cls)}
    try:
        if isinstance(obj, type) and issubclass(obj, BaseException):
            info["exc"] = _mro(obj)
    except Exception:
        pass
    return info


def describe_exception(exc):
    try:
        message = str(exc)[:2000]
    except BaseException:
        message = "<unprintable exception>"
    try:
        args = encode(list(exc.args))
    except BaseException:
        args = None
    return {"mro": _mro(type(exc)), "message": message, "args": args}


def _mutable(value):
    return any(type(value) is t for t in MUTABLE)


class JudgeCallable:
    """A callable the judge passed in (a test's fake clock, a key function): calls go back over the connection."""

    def __init__(self, server, sid):
        object.__setattr__(self, "_server", server)
        object.__setattr__(self, "_sid", sid)

    def __call__(self, *args, **kwargs):
        server = object.__getattribute__(self, "_server")
        message = {"callback": object.__getattribute__(self, "_sid")}
        message["args"] = encode(list(args), server.ref)
        message["kwargs"] = encode(dict(kwargs), server.ref)
        return server.callback(message)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        server = object.__getattribute__(self, "_server")
        return server.callback({"callback": object.__getattribute__(self, "_sid"), "attr": name})


class CallbackFailed(Exception):
    """The judge's callable raised something that is not a builtin exception."""


class Server:
    """Handles of objects given to the judge, and the dispatch of its requests."""

    def __init__(self, conn):
        self.conn = conn
        self.objects = {}
        self.ids = {}

    def ref(self, obj):
        hid = self.ids.get(id(obj))
        if hid is None:
            hid = len(self.objects) + 1
            self.objects[hid] = obj  # kept alive, so id(obj) stays unique
            self.ids[id(obj)] = hid
        return ["remote", hid, describe(obj)]

    def resolve(self, node):
        """The object a handle the judge sent stands for: one of ours, or a callable of the judge's."""
        tag, ident = node[0], node[1] if len(node) == 2 else None
        if tag == "local" and type(ident) is int:
            return JudgeCallable(self, ident)
        if tag == "remote" and type(ident) is int and ident in self.objects:
            return self.objects[ident]
        raise WireError("unknown handle")

    def target(self, message):
        try:
            return self.objects[message["h"]]
        except (KeyError, TypeError):
            raise WireError("unknown handle") from None

    def value(self, data):
        return decode(data, self.resolve)

    def handle(self, message):
        try:
            return self._handle(message)
        except BaseException as exc:  # SystemExit from the code under test is an answer too
            return {"raised": describe_exception(exc)}

    def _handle(self, message):
        op = message.get("op")
        mutated = []
        if op == "import":
            result = importlib.import_module(str(message["name"]))
        elif op == "call":
            args, kwargs = self.value(message["args"]), self.value(message["kwargs"])
            result = self.target(message)(*args, **kwargs)
            mutated = [[i, encode(a, self.ref)] for i, a in enumerate(args) if _mutable(a)]
            mutated += [[k, encode(a, self.ref)] for k, a in kwargs.items() if _mutable(a)]
        else:
            result = self._apply(op, self.target(message), message)
        return {"ok": encode(result, self.ref), "mutated": mutated}

    def _apply(self, op, obj, message):
        if op == "getattr":
            return getattr(obj, str(message["name"]))
        if op == "setattr":
            return setattr(obj, str(message["name"]), self.value(message["value"]))
        if op == "len":
            return len(obj)
        if op == "bool":
            return bool(obj)
        if op == "iter":
            return iter(obj)
        if op == "next":
            return next(obj)
        if op == "contains":
            return self.value(message["value"]) in obj
        if op == "getitem":
            return obj[self.value(message["key"])]
        if op == "setitem":
            obj[self.value(message["key"])] = self.value(message["value"])
            return None
        if op == "delitem":
            del obj[self.value(message["key"])]
            return None
        raise WireError(f"unknown op {op!r}"[:80])

    def callback(self, message):
        """Asks the judge to run one of its callables; serves the judge's nested requests meanwhile."""
        send(self.conn, message)
        while True:
            reply = recv(self.conn)
            if reply is None:
                raise ConnectionError("the judge closed the connection")
            if "op" in reply:
                send(self.conn, self.handle(reply))
            elif "cb_ok" in reply:
                return self.value(reply["cb_ok"])
            else:
                raised = reply.get("cb_raised") or {}
                names = raised.get("mro") or []
                cls = getattr(builtins, str(names[0]).rpartition(".")[2], None) if names else None
                message = str(raised.get("message", ""))
                if isinstance(cls, type) and issubclass(cls, Exception) and names[0].startswith("builtins."):
                    raise cls(message)
                raise CallbackFailed(message)

    def serve(self):
        while True:
            message = recv(self.conn)
            if message is None:
                return
            send(self.conn, self.handle(message))


def main(argv):
    path, roots = argv[1], argv[2:]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    os.chmod(path + ".new", 0o777)  # the judge runs under another uid
    listener.listen(1)
    os.rename(path + ".new", path)  # the judge, already waiting for ``path``, connects only once it listens
    conn, _ = listener.accept()
    listener.close()
    sys.path[0:0] = roots
    try:
        Server(conn).serve()
    except (OSError, PlainDataError):
        pass
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
