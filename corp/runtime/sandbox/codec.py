"""The sandbox's plain-data codec and the pipe protocol between the program and its tester.

Part of the wrapper (see wrapper.py's docstring): `wrapper.py` loads this file by its path when it
runs as a script (`python -I -S wrapper.py`, nothing of corp on the path), and imports it as
`corp.runtime.sandbox.codec` when it is itself imported (linters, the codec's tests). So this module imports
only the standard library and nothing of corp.

`decode`, in the tester's process, is the trust boundary of the tests: see the comment below.
"""

from __future__ import annotations

import builtins
import json
import math
import os

# ---------------------------------------------------------------- plain-data codec
#
# The program's side encodes whatever its functions return; the tester's side decodes. Only the
# decoder is a trust boundary: whatever bytes the program sends, `decode` builds builtins (or
# opaque handles to objects that stay in the program's process), never an object of the program's
# classes. Tags: {"L": list}, {"T": tuple}, {"S": set}, {"F": frozenset}, {"D": [[k, v], ...]},
# {"B": hex bytes}, {"A": hex bytearray}, {"C": [re, im]}, {"X": "nan"|"inf"|"-inf"},
# {"Y": name} (a builtin type such as `int`, as MBPP's `remove_datatype(t, int)` passes),
# {"O": handle} (an object kept in the program's process), {"N": name} (a name in the program's
# globals; sent by the tester only). None, bool, int, finite float and str are JSON scalars.
# Subclasses of the builtins (Counter, defaultdict, namedtuple, IntEnum, ...) travel as their
# builtin base, which they compare equal to.

MAX_DEPTH = 200
MAX_MESSAGE = 32 << 20  # bytes per message; a larger reply fails the call


class Unencodable(TypeError):
    pass


def encode(v, handles: dict | None = None, depth: int = 0):
    """JSON-able form of `v`; objects that are not plain data become handles when `handles` is given."""
    if depth > MAX_DEPTH:
        raise Unencodable("value nested too deeply")
    t = type(v)
    if v is None or t is bool or t is str or t is int:
        return v
    if t is float:
        return v if math.isfinite(v) else {"X": repr(v)}
    d = depth + 1
    for base, form in _BUILTIN_FORMS:
        if isinstance(v, base):
            return form(v, handles, d)
    if t is type and getattr(builtins, v.__name__, None) is v:
        return {"Y": v.__name__}
    if isinstance(v, Remote):
        return v._corp_ref()
    if handles is None:
        raise Unencodable(f"cannot pass a {t.__name__} between the program and its tests")
    h = len(handles)
    handles[h] = v
    return {"O": h}


# The builtins (and their subclasses, read through the base's own methods so that an override
# cannot change what travels) in the order `encode` tests them: (base, form(v, handles, depth)).
_BUILTIN_FORMS = (
    (bool, lambda v, handles, d: bool(v)),
    (int, lambda v, handles, d: int.__int__(v)),
    (float, lambda v, handles, d: encode(float.__float__(v), None, d)),
    (str, lambda v, handles, d: str.__str__(v)),
    (list, lambda v, handles, d: {"L": [encode(x, handles, d) for x in list.__iter__(v)]}),
    (tuple, lambda v, handles, d: {"T": [encode(x, handles, d) for x in tuple.__iter__(v)]}),
    (frozenset, lambda v, handles, d: {"F": [encode(x, handles, d) for x in frozenset.__iter__(v)]}),
    (set, lambda v, handles, d: {"S": [encode(x, handles, d) for x in set.__iter__(v)]}),
    (dict, lambda v, handles, d: {"D": [[encode(k, handles, d), encode(x, handles, d)] for k, x in dict.items(v)]}),
    (bytes, lambda v, handles, d: {"B": bytes.hex(v)}),
    (bytearray, lambda v, handles, d: {"A": bytearray.hex(v)}),
    (
        complex,
        lambda v, handles, d: {
            "C": [encode(complex.real.__get__(v), None, d), encode(complex.imag.__get__(v), None, d)]
        },
    ),
)


def decode(x, resolve=None, depth: int = 0):
    """Builtins (or `Remote` handles) from `encode`'s form; `resolve(tag, key)` maps handles/names."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(x)
    if x is None or t is bool or t is str or t is int or t is float:
        return x
    if t is not dict or len(x) != 1:
        raise ValueError("malformed value from the other side")
    ((tag, body),) = x.items()
    d = depth + 1
    if tag == "L":
        return [decode(e, resolve, d) for e in _list(body)]
    if tag == "T":
        return tuple(decode(e, resolve, d) for e in _list(body))
    if tag == "S":
        return {decode(e, resolve, d) for e in _list(body)}
    if tag == "F":
        return frozenset(decode(e, resolve, d) for e in _list(body))
    if tag == "D":
        return _decode_dict(body, resolve, d)
    return _decode_atom(tag, body, resolve, d)


def _decode_dict(body, resolve, d) -> dict:
    """A {"D": ...} body: [[key, value], ...] pairs, each checked for its shape."""
    out = {}
    for pair in _list(body):
        if type(pair) is not list or len(pair) != 2:
            raise ValueError("malformed dict item")
        out[decode(pair[0], resolve, d)] = decode(pair[1], resolve, d)
    return out


def _decode_atom(tag, body, resolve, d):
    """The tags that hold no nested values (bytes, complex, special floats, builtin types), the
    handles and names that only `resolve` may turn into objects, or the refusal of any other tag."""
    if tag == "B" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "A" and type(body) is str:
        return bytearray.fromhex(body)
    if tag == "C" and type(body) is list and len(body) == 2:
        re_, im = (decode(e, None, d) for e in body)
        if type(re_) not in (int, float) or type(im) not in (int, float):
            raise ValueError("malformed complex")
        return complex(re_, im)
    if tag == "X" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "Y" and type(body) is str and type(getattr(builtins, body, None)) is type:
        return getattr(builtins, body)
    if tag in ("O", "N") and resolve is not None:
        return resolve(tag, body)
    raise ValueError(f"unknown value tag {tag!r}")


def _list(body):
    if type(body) is not list:
        raise ValueError("malformed sequence")
    return body


# ---------------------------------------------------------------- tester-side proxies


class Remote:
    """Something that lives in the program's process; the tester holds only its name or handle."""

    __slots__ = ("_corp_chan", "_corp_key")

    def __init__(self, chan, key):
        object.__setattr__(self, "_corp_chan", chan)
        object.__setattr__(self, "_corp_key", key)

    def _corp_ref(self):
        return dict([self._corp_key])

    def __call__(self, *args, **kwargs):
        return self._corp_chan.request(
            {"op": "call", "ref": self._corp_ref(), "args": encode(list(args)), "kwargs": encode(kwargs)}
        )

    def __iter__(self):
        return iter(self._corp_chan.request({"op": "list", "ref": self._corp_ref()}))

    def __len__(self):
        return self._corp_chan.request({"op": "len", "ref": self._corp_ref()})

    def __repr__(self):
        return f"<object in the program: {self._corp_key[1]!r}>"


class RemoteError(RuntimeError):
    pass


class Channel:
    """Request/reply over two pipes, one JSON line each way."""

    def __init__(self, rfd: int, wfd: int):
        self.rfd, self.wfd, self.buf = rfd, wfd, bytearray()

    def send(self, msg) -> None:
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        view = memoryview(data)
        while view:
            n = os.write(self.wfd, view)
            view = view[n:]

    def recv(self):
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 1]
                return json.loads(line)
            if len(self.buf) > MAX_MESSAGE:
                raise RemoteError("the program sent a message over the size limit")
            chunk = os.read(self.rfd, 1 << 20)
            if not chunk:
                raise EOFError
            self.buf += chunk

    def request(self, msg):
        self.send(msg)
        try:
            rep = self.recv()
        except EOFError:
            raise RemoteError("the program exited before answering") from None
        if type(rep) is dict and "ok" in rep:
            return decode(rep["ok"], self._resolve)
        if type(rep) is dict and type(rep.get("E")) is list and len(rep["E"]) == 2:
            name, text = (str(s)[:2000] for s in rep["E"])
            cls = getattr(builtins, name, None)
            if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, RemoteError):
                raise cls(text)
            raise RemoteError(f"{name}: {text}")
        raise RemoteError("malformed reply from the program")

    def _resolve(self, tag, key):
        if tag == "O" and type(key) is int:
            return Remote(self, ("O", key))
        raise ValueError("the program may not send names")
