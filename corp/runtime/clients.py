"""Clients of a federated run: the non-IID split, the wire messages, and where clients run.

Simulation, stated: one launcher (this process) cuts the run's examples into K private shares and
hands each share to its client at construction; from then on the server side of a method talks
to clients only through `ClientPool.call`, i.e. encoded messages (`encode`/`decode`), whose byte
sizes are what a run reports as communication. A client holds its examples, a model and its own
private evaluation cache (RUN_DIR/clients/<k>/, the client's disk in a real deployment); the model
is a copy of its own, except where a method hands its local clients the run's backend (fedcorp's,
which only score: each sets its own weights before every evaluation).

Where clients run: `--executor local` builds each client in this process and calls them one after
the other; `--executor ray` makes each client a Ray actor (its own process). A client that dies
mid-round (a Ray actor error, or `ClientLost` raised by a client) is dropped: the round completes
with the clients that answered, weights renormalised over them, and the dropped client is not
called again in this run (the report lists it with its round). Not retried: a retry would run
the same client from the same state and is the caller's decision (rerun with the same
--output-dir: finished rounds are not redone).

In the core (floor 1: it reads the tasks' examples) because several methods use it: `corp fedcorp`
(corp/methods/fedcorp/), `corp fgrpo` and `corp fera` (corp/methods/), and the bench, which checks a
federated cell's client split before the cell runs (the FGRPO method's bench adapter, corp/methods/fgrpo.py).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from corp.errors import ClientLost, CorpError
from corp.evaluate.tasks import Example
from corp.extras import require
from corp.runtime.executors import init_ray

SPLIT_RULES = ("op", "answer-length", "iid")


# ---------------------------------------------------------------- the non-IID split


def client_key(example: Example, rule: str) -> str:
    """The group an example belongs to under `rule` (examples of one group go to one client)."""
    if rule == "op":
        expr = (example.columns or {}).get("expression")
        if not isinstance(expr, str):
            raise CorpError(
                "--split-by op needs a task whose examples carry an arithmetic "
                "expression (arith); use --split-by answer-length or iid"
            )
        ops = [t for t in expr.split() if t in ("+", "-", "*")]
        return "".join(sorted(set(ops))) or "none"
    if rule == "answer-length":
        return f"{len(str(example.answer).lstrip('-')):03d}"
    raise CorpError(f"--split-by '{rule}' is unknown; choose one of {', '.join(SPLIT_RULES)}")


def split_clients(examples: Sequence[Example], k: int, rule: str, what: str = "support") -> list[list[Example]]:
    """K shares of `examples`. op / answer-length: the distinct keys, sorted, dealt to clients in
    turn (key j -> client j mod K), so each client sees its own operators or answer lengths
    (non-IID); iid: example i -> client i mod K. A client with an empty share is one error."""
    if k < 1:
        raise CorpError(f"--clients must be >= 1, got {k}")
    if rule not in SPLIT_RULES:
        raise CorpError(f"--split-by '{rule}' is unknown; choose one of {', '.join(SPLIT_RULES)}")
    shares: list[list[Example]] = [[] for _ in range(k)]
    if rule == "iid":
        for i, e in enumerate(examples):
            shares[i % k].append(e)
    else:
        keys = sorted({client_key(e, rule) for e in examples})
        where = {key: j % k for j, key in enumerate(keys)}
        for e in examples:
            shares[where[client_key(e, rule)]].append(e)
    empty = [i for i, s in enumerate(shares) if not s]
    if empty:
        n_keys = len({client_key(e, rule) for e in examples}) if rule != "iid" and examples else len(examples)
        raise CorpError(
            f"client {empty[0]} gets no {what} examples: --split-by {rule} gives {n_keys} group(s) of {len(examples)} "
            f"{what} example(s) for --clients {k}; use fewer clients, more examples (--n-{what}), a task with more "
            "groups (e.g. arith:ops=+-*) or --split-by iid"
        )
    return shares


def partition_ids(examples: Sequence[Example], k: int, rule: str) -> list[list[int]]:
    """Positions of `examples` in each client's group (the same rule as split_clients; empty allowed):
    for per-client accuracy on the server's test split."""
    out: list[list[int]] = [[] for _ in range(k)]
    if rule == "iid":
        for i in range(len(examples)):
            out[i % k].append(i)
        return out
    keys = sorted({client_key(e, rule) for e in examples})
    where = {key: j % k for j, key in enumerate(keys)}
    for i, e in enumerate(examples):
        out[where[client_key(e, rule)]].append(i)
    return out


def check_signatures(signatures: Sequence[dict]) -> dict:
    """All clients must hold the same task (same signature): one error naming the first mismatch."""
    if not signatures:
        raise CorpError("no client answered")
    first = signatures[0]
    for i, s in enumerate(signatures[1:], start=1):
        if s != first:
            raise CorpError(
                f"client {i} holds task {json.dumps(s, sort_keys=True)}, client 0 holds "
                f"{json.dumps(first, sort_keys=True)}: every client of one run must hold the same task signature"
            )
    return first


# ---------------------------------------------------------------- wire messages

_ZIP = b"PK"


def _has_tensor(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, dict):
        return any(_has_tensor(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_has_tensor(v) for v in obj)
    return False


def encode(message: dict) -> bytes:
    """A message as bytes: JSON when it holds no tensor (seeds, rewards, verdicts), else torch's
    zip format (loaded back with weights_only=True: plain containers and tensors only)."""
    if _has_tensor(message):
        buf = io.BytesIO()
        torch.save(message, buf)
        return buf.getvalue()
    return json.dumps(message, sort_keys=True, separators=(",", ":")).encode()


def decode(wire: bytes) -> dict:
    if wire[:2] == _ZIP:
        return torch.load(io.BytesIO(wire), map_location="cpu", weights_only=True)
    return json.loads(wire.decode())


class ClientBase:
    """One client: `handle(wire) -> wire` dispatches on the message's `op` to `op_<name>`.

    Subclasses hold the private state. `hello` returns the task signature and share sizes (the
    server checks that every client holds the same task)."""

    def handle(self, wire: bytes) -> bytes:
        msg = decode(wire)
        op = msg.get("op")
        fn = getattr(self, f"op_{op}", None)
        if fn is None:
            raise CorpError(f"client received an unknown message '{op}'")
        return encode(fn(msg))


# ---------------------------------------------------------------- where clients run


@dataclass
class Traffic:
    """Bytes of one round (or one phase), both directions, per client."""

    down: dict[int, int]
    up: dict[int, int]

    @property
    def total(self) -> int:
        return sum(self.down.values()) + sum(self.up.values())

    def to_dict(self) -> dict:
        return {
            "down_bytes": sum(self.down.values()),
            "up_bytes": sum(self.up.values()),
            "total_bytes": self.total,
            "per_client": {
                str(k): {"down": self.down.get(k, 0), "up": self.up.get(k, 0)}
                for k in sorted(set(self.down) | set(self.up))
            },
        }


class ClientPool:
    """K clients behind one call interface; `factories[k]()` builds client k (in this process, or
    inside its Ray actor). Clients are built on first call, so a resumed run that has nothing left
    to do loads no model. `log(k, direction, message)` sees every decoded message (tests)."""

    def __init__(
        self,
        factories: Sequence[Callable[[], ClientBase]],
        executor: str = "local",
        log: Callable[[int, str, dict], None] | None = None,
        ray_address: str | None = None,
    ):
        if executor not in ("local", "ray"):
            raise CorpError(f"unknown --executor '{executor}'; choose one of local, ray")
        self.factories, self.executor, self.log = list(factories), executor, log
        self.clients: dict[int, Any] = {}
        self.dropped: dict[int, str] = {}  # client -> why (round and error)
        self._ray = None
        self.ray_address = ray_address

    @property
    def alive(self) -> list[int]:
        return [k for k in range(len(self.factories)) if k not in self.dropped]

    def _client(self, k: int):
        if k not in self.clients:
            if self.executor == "ray":
                if self._ray is None:
                    self._ray = require("ray", "--executor ray")
                    self._started_ray = init_ray(self._ray, self.ray_address, len(self.factories))
                actor = self._ray.remote(_RayClient)
                self.clients[k] = actor.remote(self.factories[k])
            else:
                self.clients[k] = self.factories[k]()
        return self.clients[k]

    def _send(self, k: int, wire: bytes) -> bytes:
        client = self._client(k)
        if self.executor == "ray":
            try:
                return self._ray.get(client.handle.remote(wire))
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.WorkerCrashedError) as exc:
                raise ClientLost(f"Ray actor died: {type(exc).__name__}") from None
        return client.handle(wire)

    def call(self, messages: dict[int, dict], where: str) -> tuple[dict[int, dict], Traffic]:
        """Send message k to client k (alive ones only); the replies of those that answered.
        A client that dies here is dropped (see the module docstring)."""
        replies: dict[int, dict] = {}
        down: dict[int, int] = {}
        up: dict[int, int] = {}
        for k, msg in messages.items():
            if k in self.dropped:
                continue
            wire = encode(msg)
            down[k] = len(wire)
            if self.log:
                self.log(k, "down", decode(wire))
            try:
                answer = self._send(k, wire)
            except ClientLost as exc:
                self.dropped[k] = f"{where}: {exc}"
                self.clients.pop(k, None)
                continue
            up[k] = len(answer)
            reply = decode(answer)
            if self.log:
                self.log(k, "up", reply)
            replies[k] = reply
        if not replies and messages:
            raise CorpError(
                f"{where}: every client was lost ({'; '.join(f'client {k}: {v}' for k, v in self.dropped.items())}); "
                "rerun with the same --output-dir to resume"
            )
        return replies, Traffic(down, up)

    def close(self) -> None:
        if self._ray is not None:
            for c in self.clients.values():
                self._ray.kill(c)
            if getattr(self, "_started_ray", False):  # the local Ray this pool started
                self._ray.shutdown()
        self.clients.clear()


class _RayClient:
    """A Ray actor holding one client (built inside the actor's process)."""

    def __init__(self, factory):
        self.client = factory()

    def handle(self, wire: bytes) -> bytes:
        return self.client.handle(wire)
