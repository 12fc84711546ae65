"""The judge's view of the repository under test: modules and objects that live in another process.

Runs inside the judge (``repo_judge.py``, the judge user), which never imports
or executes code of the repository. :class:`RemoteFinder` makes ``import
textkit.slug`` in a hidden test return a module whose attributes are fetched
from ``repo_server.py`` over a :class:`Link`. What comes back is plain data,
decoded into fresh builtin values (so ``assert slugify(x) == "a-b"`` compares
two genuine ``str``), or a :class:`RemoteObject` handle, or an exception.

A handle forwards attribute access, calls, ``len``, ``bool``, iteration,
``in`` and indexing, each result checked for the type Python requires. It
never forwards comparisons or hashing: a handle equals only itself, so an
object whose ``__eq__`` always says yes, or a float subclass dressed up as
``fractions.Fraction``, compares equal to nothing here. Exceptions come back as
local classes: builtin ones as themselves, the repository's own as *mirror*
classes with the same names and builtin base (so ``pytest.raises(CycleError)``
and ``pytest.raises(ValueError)`` both behave as written); ``SystemExit`` and
other non-``Exception`` escapes become :class:`RemoteError`.

Arguments go by value; lists, dicts, sets and bytearrays that the call mutated
are updated in place afterwards, so ``median(data); assert data == [3, 1, 2]``
keeps its meaning. A non-data argument (a test's fake clock, a key function)
stays here: the repository gets a callable that calls back, and may call it
or read plain-data attributes from it, nothing else.

A handle has one answer. Looks at the repository's state (an attribute,
``len``, ``bool``, ``in``, ``[]``, iteration) are asked once and remembered
until the judge next makes the repository *act* (a call, an assignment, a
deletion, ``next`` on an iterator): code under test cannot answer a test's
second look differently from its first, so an object that yields the input on
one pass and nothing on the next (a "permutation" and "sorted" at once) fails.
Iterating a re-iterable object materialises its items once, pulled as the
test consumes them (an endless generator stays usable) and replayed on every
later pass; an object that is its own iterator is consumed, item by item, as
in Python.
"""

import builtins
import importlib.util
import json
import socket
import time

if __package__:  # imported on the host, as part of envs
    from envs.domains.repair.in_sandbox.repo_wire import MUTABLE, WireError, recv, send
    from envs.in_sandbox.plain_data import PlainDataError, decode, encode
else:  # shipped: repo_wire.py and plain_data.py sit beside this file
    from plain_data import PlainDataError, decode, encode
    from repo_wire import MUTABLE, WireError, recv, send


class RemoteError(Exception):
    """The repository raised something that is not an ``Exception``, or could not be reached."""


class RemoteGone(RemoteError):
    """The repository process is gone, misbehaved on the wire, or was interrupted: every later call fails."""


def _builtin_exception(name):
    if not name.startswith("builtins."):
        return None
    cls = getattr(builtins, name[len("builtins.") :], None)
    return cls if isinstance(cls, type) and issubclass(cls, BaseException) else None


class Link:
    """One connection to the repository server; requests are strictly nested (callbacks included)."""

    def __init__(self, sock):
        self.sock = sock
        self.dead = None
        self.stubs, self.stub_ids = {}, {}
        self.mirrors, self.mirror_handles = {}, {}
        # Looks at the repository's state since it last acted: request -> reply, handle -> pulled items.
        self.looks, self.streams = {}, {}

    @classmethod
    def connect(cls, path, wait_s=10.0):
        """Connects to the server listening at ``path``, waiting up to ``wait_s`` for it to start (it
        starts beside the judge, so that their interpreters load at the same time)."""
        deadline = time.monotonic() + wait_s
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
                return cls(sock)
            except OSError as exc:
                sock.close()
                if time.monotonic() > deadline:
                    raise OSError(f"the repository server did not start within {wait_s:g} s ({exc})") from None
                time.sleep(0.002)

    # -- the wire ------------------------------------------------------------------
    def request(self, message):
        if self.dead:
            raise RemoteGone(self.dead)
        try:
            send(self.sock, message)
            while True:
                reply = recv(self.sock)
                if reply is None:
                    raise WireError("the repository process closed the connection")
                if "callback" not in reply:
                    return reply
                send(self.sock, self._callback(reply))
        except (OSError, WireError) as exc:
            self._kill(f"{type(exc).__name__}: {exc}")
            raise RemoteGone(self.dead) from None
        except BaseException:  # a time limit interrupted the wait: replies would be out of step
            self._kill("interrupted while waiting for the repository")
            raise

    def _kill(self, why):
        self.dead = why
        try:
            self.sock.close()
        except OSError:
            pass

    def ask(self, message, args=None, kwargs=None):
        """The value of a request that makes the repository act (raising what it raised); forgets every look."""
        self.forget()
        try:
            return self.value(self.request(message), args, kwargs)
        finally:
            self.forget()  # the act may have changed what any later look sees

    def look(self, message):
        """The value of a look at the repository's state: asked once, the same answer until it next acts."""
        key = json.dumps(message, sort_keys=True)
        reply = self.looks.get(key)
        if reply is None:
            reply = self.looks[key] = self.request(message)
        return self.value(reply)

    def forget(self):
        self.looks.clear()
        self.streams.clear()

    def items(self, iterator):
        """The items of one pass over a re-iterable object: pulled from ``iterator`` once, replayed after."""
        stream = self.streams.setdefault(object.__getattribute__(iterator, "_id"), ([], []))
        pulled, ended = stream
        i = 0
        while True:
            if i == len(pulled):
                if ended:
                    return
                reply = self.request({"op": "next", "h": object.__getattribute__(iterator, "_id")})
                if _stops(reply):
                    ended.append(True)
                    return
                pulled.append(reply)
            i += 1
            yield self.value(pulled[i - 1])

    def value(self, reply, args=None, kwargs=None):
        """A reply decoded afresh (so a remembered one hands out no shared mutable value), or its exception."""
        if "raised" in reply:
            raise self.exception(reply["raised"])
        if "ok" not in reply:
            self._kill("malformed reply")
            raise RemoteGone(self.dead)
        try:
            value = decode(reply["ok"], self.resolve)
            for key, data in reply.get("mutated") or []:
                target = args[key] if type(key) is int and args and key < len(args) else (kwargs or {}).get(key)
                _update(target, decode(data, self.resolve))
        except (PlainDataError, TypeError, KeyError, IndexError) as exc:
            self._kill(f"malformed reply: {exc}")
            raise RemoteGone(self.dead) from None
        return value

    # -- values ----------------------------------------------------------------------
    def encode(self, value):
        return encode(value, self.ref)

    def ref(self, obj):
        if type(obj) is RemoteObject and object.__getattribute__(obj, "_link") is self:
            return ["remote", object.__getattribute__(obj, "_id")]
        if isinstance(obj, type) and obj in self.mirror_handles:
            return ["remote", self.mirror_handles[obj]]
        sid = self.stub_ids.get(id(obj))
        if sid is None:
            sid = len(self.stubs) + 1
            self.stubs[sid], self.stub_ids[id(obj)] = obj, sid
        return ["local", sid]

    def resolve(self, node):
        """What a handle the repository sent stands for: a callable of ours, a remote object or exception class."""
        if node[0] == "local" and len(node) == 2:
            try:
                return self.stubs[node[1]]
            except (KeyError, TypeError):
                raise WireError("unknown callable") from None
        if node[0] != "remote" or len(node) != 3:
            raise WireError("malformed handle")
        hid, info = node[1], node[2]
        if type(hid) is not int or type(info) is not dict:
            raise WireError("malformed handle")
        if type(info.get("exc")) is list:
            cls = self.exception_class([str(n) for n in info["exc"][:64]])
            self.mirror_handles.setdefault(cls, hid)
            return cls
        return RemoteObject(self, hid, str(info.get("type", "?"))[:200])

    def exception(self, raised):
        """A local exception for what the repository raised (its class names, message and plain args)."""
        raised = raised if type(raised) is dict else {}
        names = raised.get("mro")
        names = [str(n) for n in names[:64]] if type(names) is list and names else ["?"]
        cls = self.exception_class(names)
        message = str(raised.get("message", ""))[:2000]
        for attempt in (lambda: cls(*decode(raised.get("args"))), lambda: cls(message)):
            try:
                return attempt()
            except Exception:
                continue
        return RemoteError(f"{names[0]}: {message}")

    def exception_class(self, names):
        """The local class for an exception class's MRO names: a builtin, or a mirror of the repository's class."""
        index = next((i for i, name in enumerate(names) if _builtin_exception(name) is not None), len(names))
        anchor = _builtin_exception(names[index]) if index < len(names) else RemoteError
        if not issubclass(anchor, Exception):
            anchor = RemoteError  # SystemExit, KeyboardInterrupt, ... must not stop the judge
        cls = anchor
        for name in reversed(names[:index]):
            if name in ("builtins.object",):
                continue
            key = (name, cls)
            if key not in self.mirrors:
                module, _, qualname = name.rpartition(".")
                self.mirrors[key] = type(qualname or "Mirror", (cls,), {"__module__": module, "__qualname__": qualname})
            cls = self.mirrors[key]
        return cls

    # -- callbacks -----------------------------------------------------------------
    def _callback(self, message):
        try:
            obj = self.stubs[message.get("callback")]
            if "attr" in message:
                name = str(message["attr"])
                if name.startswith("_"):
                    raise AttributeError(name)
                result = encode(getattr(obj, name), self._plain_or_remote)
            else:
                args, kwargs = decode(message.get("args"), self.resolve), decode(message.get("kwargs"), self.resolve)
                if type(args) is not list or type(kwargs) is not dict:
                    raise WireError("malformed callback")
                result = encode(obj(*args, **kwargs), self._plain_or_remote)
            return {"cb_ok": result}
        except Exception as exc:
            names = [f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__]
            return {"cb_raised": {"mro": names, "message": str(exc)[:500]}}

    def _plain_or_remote(self, obj):
        if type(obj) is RemoteObject:
            return self.ref(obj)
        raise WireError("a callback may only return plain data")


def _stops(reply):
    raised = reply.get("raised")
    names = raised.get("mro") if type(raised) is dict else None
    return type(names) is list and bool(names) and names[0] == "builtins.StopIteration"


def _update(target, new):
    """Carries a mutation the repository made to an argument back into the judge's object."""
    t = type(target)
    if not any(t is m for m in MUTABLE) or type(new) is not t:
        return
    if t is dict or t is set:
        target.clear()
        target.update(new)
    else:
        target[:] = new


class RemoteObject:
    """An object of the repository under test, by handle. See the module docstring for what it forwards."""

    __slots__ = ("_id", "_link", "_type")

    def __init__(self, link, hid, type_name):
        for name, value in (("_link", link), ("_id", hid), ("_type", type_name)):
            object.__setattr__(self, name, value)

    def _ask(self, op, sent=None, /, **fields):
        """One act of this object; ``sent``: the (args, kwargs) of a call, to carry mutations back."""
        link = object.__getattribute__(self, "_link")
        message = {"op": op, "h": object.__getattribute__(self, "_id"), **fields}
        return link.ask(message, *(sent or (None, None)))

    def _look(self, op, **fields):
        """One look at this object's state (see the module docstring: it has one answer until the next act)."""
        link = object.__getattribute__(self, "_link")
        return link.look({"op": op, "h": object.__getattribute__(self, "_id"), **fields})

    def _encode(self, value):
        return object.__getattribute__(self, "_link").encode(value)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._look("getattr", name=name)

    def __setattr__(self, name, value):
        self._ask("setattr", name=name, value=self._encode(value))

    def __call__(self, *args, **kwargs):
        args = list(args)
        encoded = {"args": self._encode(args), "kwargs": self._encode(dict(kwargs))}
        return self._ask("call", (args, kwargs), **encoded)

    def __len__(self):
        n = self._look("len")
        if type(n) is not int or n < 0:
            raise TypeError(f"len() of a repository object gave {n!r}"[:200])
        return n

    def __bool__(self):
        b = self._look("bool")
        if type(b) is not bool:
            raise TypeError("bool() of a repository object gave a non-bool")
        return b

    def __iter__(self):
        it = self._look("iter")
        if type(it) is not RemoteObject:
            raise TypeError("iter() of a repository object gave a non-iterator")
        if _key(it) == _key(self):  # its own iterator: each next() consumes one item, as in Python
            return it
        return object.__getattribute__(self, "_link").items(it)

    def __next__(self):
        return self._ask("next")

    def __contains__(self, item):
        return bool(self._look("contains", value=self._encode(item)) is True)

    def __getitem__(self, key):
        return self._look("getitem", key=self._encode(key))

    def __setitem__(self, key, value):
        self._ask("setitem", key=self._encode(key), value=self._encode(value))

    def __delitem__(self, key):
        self._ask("delitem", key=self._encode(key))

    def __eq__(self, other):
        return type(other) is RemoteObject and _key(self) == _key(other)

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash(_key(self))

    def __repr__(self):
        return f"<{object.__getattribute__(self, '_type')} object of the repository under test>"


def _key(obj):
    return id(object.__getattribute__(obj, "_link")), object.__getattribute__(obj, "_id")


class RemoteFinder:
    """A meta-path finder and loader: the repository's top-level packages come from the server, never from disk."""

    def __init__(self, link, names):
        self.link, self.names = link, frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in self.names:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        handle = self.link.ask({"op": "import", "name": module.__name__})
        if type(handle) is not RemoteObject:
            raise ImportError(f"the repository gave no module for {module.__name__!r}")

        def remote_attribute(name):
            if name == "__all__":
                return handle._look("getattr", name=name)
            return getattr(handle, name)

        module.__getattr__ = remote_attribute
        module.__path__ = []
