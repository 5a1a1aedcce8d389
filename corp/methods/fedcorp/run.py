"""Federated weight space (`corp fedcorp`): CoRP stage 1 across K clients that never share data.

Ours (docs/methods.md, "Federated weight space"; issue 14), not a published method. Where it departs
from the centralised CoRP (the operator, corp/algorithms/corp_operator/stage1.py), and why:
- Population: the server broadcasts N (seed, sigma) pairs; every client rebuilds each specialist
  from its seed and scores it on its private support share; only (seed-indexed) mean rewards, the
  client's base-model mean reward, its share size and its token counts go back.
- Combined rewards (`--combine`): `mean` (default) is the data-weighted mean of the clients' mean
  rewards, which is exactly the specialist's mean reward on the pooled support examples, so stage 1
  sees what centralised CoRP would; `gain` weights each client's relative gain over its own base
  reward (FGRPO's normalisation, corp.methods.fedcorp.combine.combine_client_rewards).
- Step search: stage-1 weights and merged directions come from the same operator
  (`merge_and_search`, one OperatorConfig). The probe stays federated: the server sends each
  candidate (seeds, coefficients, alpha: a few hundred bytes) and every client returns its mean
  probe reward on its private probe share; the candidate's probe score is the same combination.
- Gate: the best candidate goes to every client, which gates it against the base on its own
  validation share with the usual paired lower bound (corp.algorithms.corp_operator.gate.paired_gate) and
  returns accept/reject with (n, mean gain, lower bound): a veto is counted, never its data. The
  candidate is deployed iff at least --min-accept of the clients that answered accept (default 1:
  any veto abstains). Pooled validation is never formed.
- Stage 2 (re-centring rounds) is not federated here (--stage2-rounds must be 0).
- Compute: the ledger counts every client's scoring, probe and gate tokens and the server's test
  evaluations; the server's Gram matrix (noise regenerated from seeds, no tokens) is not in it.
Result: a corp-direction recipe (seeds and coefficients) that `corp apply` rebuilds, and the model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import ClassVar

from corp.algorithms.corp_operator.config import OperatorConfig
from corp.algorithms.corp_operator.gate import paired_gate
from corp.algorithms.corp_operator.stage1 import merge_and_search
from corp.algorithms.perturb import Direction, ParamFilter
from corp.algorithms.perturb.direction import Merged
from corp.algorithms.recipe import make_recipe, produced_weights
from corp.config import PopulationConfig
from corp.errors import CorpError
from corp.evaluate.rewards import resolve_reward
from corp.evaluate.scorer import specialists_for
from corp.evaluate.tasks import get_task
from corp.extras import require
from corp.methods.fedcorp.combine import COMBINE_RULES, combine_client_rewards
from corp.runtime.backends.base import MODEL, PERTURBER, Backend
from corp.runtime.clients import (
    SPLIT_RULES,
    ClientBase,
    ClientPool,
    Traffic,
    check_signatures,
    partition_ids,
    split_clients,
)
from corp.runtime.context import EvalCache, RunContext, cached_eval, direction_fingerprint, run_evals
from corp.runtime.loop import Outputs, drive, method_rows
from corp.runtime.progress import progress_disabled

NAME = "fedcorp"  # the command, the report's method and its deployed row
CLIENT_SPLITS = ("support", "probe", "validation")


@dataclass
class FedCorpConfig(OperatorConfig, PopulationConfig):
    clients: int = 3
    """K: number of clients; each gets its own share of the support, probe and validation splits."""
    split_by: str = "op"
    """How examples are dealt to clients: op (arith operator: non-IID, needs e.g. arith:ops=+-*), answer-length (non-IID by answer digits) or iid."""
    combine: str = "mean"
    """How clients' rewards are combined: mean (data-weighted: the pooled mean reward) or gain (relative gain over each client's base reward)."""
    min_accept: float = 1.0
    """Share of answering clients that must accept the candidate on their own validation split (1: any veto abstains)."""
    executor: str = "local"
    """Where clients run: local (built in this process, called in turn) or ray (one Ray actor, i.e. process, per client; --workers is not used)."""
    sigmas: list[float] | str = "5e-4,1e-3,2e-3"
    """Noise scales, comma-separated; specialist i gets sigmas[i % len(sigmas)]. Fixed (the paper grid by default): calibrating them from the model (--sigmas auto in score, randopt, consolidate) would need the clients' prompts, which stay with the clients."""

    # a Ray actor client loads a model of its own, and only scores with it; local clients use the driver's
    client_models: ClassVar[tuple[str, ...]] = ("ray",)
    client_host_copy: ClassVar[str | None] = None
    # the clients score in their own directories; the run itself writes no metrics rows to log
    not_options: ClassVar[tuple[str, ...]] = ("report_to",)

    def validate(self) -> FedCorpConfig:
        if isinstance(self.sigmas, str) and self.sigmas.strip().lower() == "auto":
            raise CorpError(
                "--sigmas auto calibrates on the support prompts, which fedcorp's clients keep to themselves; "
                "give the noise scales, e.g. --sigmas 5e-4,1e-3,2e-3"
            )
        PopulationConfig.validate(self)
        OperatorConfig.validate(self)
        if self.clients < 1:
            raise CorpError(f"--clients must be >= 1, got {self.clients}")
        if self.split_by not in SPLIT_RULES:
            raise CorpError(f"--split-by '{self.split_by}' is unknown; choose one of {', '.join(SPLIT_RULES)}")
        if self.combine not in COMBINE_RULES:
            raise CorpError(f"--combine '{self.combine}' is unknown; choose one of {', '.join(COMBINE_RULES)}")
        if not 0.0 < self.min_accept <= 1.0:
            raise CorpError(f"--min-accept must be in (0, 1], got {self.min_accept}")
        if self.rounds:
            raise CorpError(
                "--stage2-rounds (CoRP stage 2) is not federated; fedcorp runs stage 1 only: use --stage2-rounds 0"
            )
        if self.from_run:
            raise CorpError("--from-run takes a pooled population; fedcorp's clients score their own: drop --from-run")
        if self.executor == "ray":
            require(
                "ray", "--executor ray"
            )  # before anything is computed: a missing Ray is one line, no run directory left
        return self


# ---------------------------------------------------------------- the client


class CorpClient(ClientBase):
    """One fedcorp client: its private shares and evaluation cache (its directory), and a model.

    `backend`: where this client runs in the server's process (`--executor local`), a function that
    gives the run's own backend, so K clients hold no weights of their own (a 1.5B float32 model:
    7.1 GB of written weights and 1.9 GB of noise buffers each); every evaluation sets its direction
    first (`cached_eval`), so what it scores is what a copy of its own would score. None (a Ray actor,
    its own process): the client loads its own copy, on first use."""

    def __init__(
        self, cfg: FedCorpConfig, index: int, shares: dict, run_dir: str, backend: Callable[[], Backend] | None = None
    ):
        self.cfg, self.index, self.shares, self.run_dir = cfg, index, shares, Path(run_dir)
        self._ctx = self._cache = None
        self._backend = backend

    def _context(self):
        if self._ctx is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._ctx = RunContext(
                self.cfg,
                "fedcorp-client",
                get_task(self.cfg.task, self.cfg.data),
                dict(self.shares),
                self.run_dir,
                resolve_reward(self.cfg.reward),
                None if self._backend is None else self._backend(),  # given: its giver's, never closed here
            )
            self._cache = EvalCache(self.run_dir / "evals.jsonl")
        return self._ctx, self._cache

    def _eval(self, direction, split):
        ctx, cache = self._context()
        return cached_eval(ctx, cache, split, direction)

    @staticmethod
    def _tokens(rows) -> dict:
        return {
            "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
            "generated_tokens": sum(r["generated_tokens"] for r in rows),
        }

    def op_hello(self, msg: dict) -> dict:

        return {
            "signature": get_task(self.cfg.task, self.cfg.data).signature(),
            **{f"n_{s}": len(self.shares[s]) for s in CLIENT_SPLITS},
        }

    def op_score(self, msg: dict) -> dict:
        rows = [
            self._eval(Direction.single(int(s), float(sg)), "support") for s, sg in zip(msg["seeds"], msg["sigmas"])
        ]
        base = self._eval(None, "support")
        return {
            "rewards": [float(r["reward"]) for r in rows],
            "base": float(base["reward"]),
            "n": len(self.shares["support"]),
            "tokens": self._tokens(rows + [base]),
        }

    def op_probe(self, msg: dict) -> dict:
        rows = [self._eval(None if c is None else Direction.from_json(c), "probe") for c in msg["candidates"]]
        base = self._eval(None, "probe")
        return {
            "rewards": [float(r["reward"]) for r in rows],
            "base": float(base["reward"]),
            "n": len(self.shares["probe"]),
            "tokens": self._tokens(rows + [base]),
        }

    def op_gate(self, msg: dict) -> dict:
        cand, base = self._eval(Direction.from_json(msg["direction"]), "validation"), self._eval(None, "validation")
        g = paired_gate(cand["rewards"], base["rewards"], float(msg["z"]))
        return {
            "accept": bool(g.accepted),
            "n": g.n,
            "mean_gain": float(g.mean_diff),
            "lcb": float(g.lcb) if math.isfinite(g.lcb) else None,
            "tokens": self._tokens([cand, base]),
        }


# ---------------------------------------------------------------- the server


class _Phase:
    """Traffic and client tokens of one phase of the round (population, probe, gate)."""

    def __init__(self):
        self.down: dict[int, int] = {}
        self.up: dict[int, int] = {}
        self.calls = 0
        self.tokens = {"prompt_tokens": 0, "generated_tokens": 0}

    def add(self, traffic: Traffic, replies: dict) -> None:
        self.calls += 1
        for k, v in traffic.down.items():
            self.down[k] = self.down.get(k, 0) + v
        for k, v in traffic.up.items():
            self.up[k] = self.up.get(k, 0) + v
        for r in replies.values():
            for t in self.tokens:
                self.tokens[t] += int(r["tokens"][t])

    def to_dict(self) -> dict:
        return {
            **Traffic(self.down, self.up).to_dict(),
            "messages_per_client": self.calls,
            "client_tokens": dict(self.tokens),
        }


class FederatedProbe:
    """The operator's score function on the probe split: one scalar per candidate, combined across
    clients, each client scoring the candidate on its own probe share (memoised per direction)."""

    def __init__(self, pool: ClientPool, cfg: FedCorpConfig, phase: _Phase):
        self.pool, self.cfg, self.phase, self.memo = pool, cfg, phase, {}

    def __call__(self, direction, split):
        if split != "probe":
            raise CorpError(f"federated CoRP scores candidates on the clients' probe shares only, not on '{split}'")

        key = direction_fingerprint(direction)
        if key not in self.memo:
            payload = None if direction is None or direction.is_zero() else direction.to_json()
            replies, traffic = self.pool.call(
                {k: {"op": "probe", "candidates": [payload]} for k in self.pool.alive}, "probe"
            )
            self.phase.add(traffic, replies)
            ks = sorted(replies)
            combined = combine_client_rewards(
                [[replies[k]["rewards"][0]] for k in ks],
                [replies[k]["n"] for k in ks],
                [replies[k]["base"] for k in ks],
                self.cfg.combine,
            )
            self.memo[key] = [combined[0]]
        return self.memo[key]


def run_fedcorp(cfg: FedCorpConfig, backend=None, log=None) -> dict:
    """`log(client, 'down'|'up', message)` sees every message (tests)."""
    needs = ("support", "probe", "validation", "test")
    return drive(cfg, NAME, backend, lambda ctx: _fedcorp(cfg, ctx, log), needs=needs, defines=None)


@dataclass
class _Outcome:
    """What the clients' one round decided: the population's rewards, the candidates and the gate."""

    client_rewards: dict
    rewards: list
    perts: list
    base_probe: float
    stages: list
    cands: dict
    best: object
    verdicts: dict
    accepted: bool
    reason: str


def _fedcorp(cfg: FedCorpConfig, ctx, log) -> Outputs:
    K = cfg.clients
    shares = {s: split_clients(ctx.splits[s], K, cfg.split_by, s) for s in CLIENT_SPLITS}
    # clients in this process score with the run's own model (one load, not K + 1: a 1.5B float32 model
    # took 9 GB a client); a Ray actor, another process, loads its own
    shared = (lambda: ctx.backend) if cfg.executor == "local" else None
    factories = [
        partial(
            CorpClient, cfg, k, {s: shares[s][k] for s in CLIENT_SPLITS}, str(ctx.run_dir / "clients" / str(k)), shared
        )
        for k in range(K)
    ]
    pool = ClientPool(factories, cfg.executor, log=log, ray_address=cfg.ray_address)
    phases = {p: _Phase() for p in ("hello", "population", "probe", "gate")}
    try:
        out = _client_round(cfg, ctx, pool, phases)
    finally:
        pool.close()

    direction = out.best.direction if out.accepted else Direction()
    if shared is not None:
        _hand_back(ctx, direction)
    outputs = _fedcorp_outputs(cfg, ctx, out, direction, shares, phases, pool)  # evaluates base and deployed on test
    made_by = {
        "method": NAME,
        "accepted": out.accepted,
        "reason": out.reason,
        "candidate": out.best.name,
        "clients": K,
        "combine": cfg.combine,
        "verdicts": out.verdicts,
    }
    ctx.backend.set_direction(direction)  # the deployed weights (the test evaluations moved them): saved, and described
    pf = ParamFilter(cfg.include, cfg.exclude)
    produced = produced_weights(ctx.backend.model)
    scheme = ctx.backend.perturber.scheme
    recipe = make_recipe(
        cfg.model, ctx.model_id, ctx.weights_hash, pf, direction, made_by, scheme=scheme, produced=produced
    )
    outputs.recipe, outputs.model = recipe, (ctx.backend.model, ctx.backend.tokenizer)
    return outputs


def _hand_back(ctx, direction: Direction) -> None:
    """What the local clients left in the run's backend that the server must not carry: the M of the
    merged candidates they scored (the hf Perturber keeps the last one applied, one fp32 copy of the
    weights), freed unless the deployed direction is made of it (its test row and the saved model apply it
    next: the same M, the same bits). The weights the clients left are the server's to set, and it sets
    them before each evaluation and before saving; clients never move the base or cache a prefix."""
    if ctx.has_backend() and ctx.backend.shares_weights:  # a vLLM engine keeps no M between pushes
        ctx.backend.perturber.release_merged(keep=[t for t in direction.components if isinstance(t, Merged)])


def _client_round(cfg: FedCorpConfig, ctx, pool: ClientPool, phases: dict) -> _Outcome:
    """Hello, the population scored by every client, the federated step search, the clients' gate."""
    progress = not progress_disabled()
    replies, traffic = pool.call({k: {"op": "hello"} for k in range(cfg.clients)}, "hello")
    phases["hello"].add(traffic, {k: {"tokens": {"prompt_tokens": 0, "generated_tokens": 0}} for k in replies})
    check_signatures([ctx.task.signature()] + [replies[k]["signature"] for k in sorted(replies)])
    # read before the clients score: on vLLM reading the host's Perturber materialises the direction the
    # (shared) engine was given last, and the base is all the Gram matrix needs (names and shapes)
    ctx.backend.require(PERTURBER, "corp fedcorp (Gram matrix, merged directions)")
    ctx.backend.require(MODEL, "corp fedcorp (it saves the consolidated model)")
    params = [(n, p.shape) for n, p in ctx.backend.perturber.params]
    scheme = ctx.backend.perturber.scheme

    specialists = specialists_for(cfg)
    seeds, sigmas = [s for s, _ in specialists], [float(sg) for _, sg in specialists]
    replies, traffic = pool.call(
        {k: {"op": "score", "seeds": seeds, "sigmas": sigmas} for k in pool.alive}, "population"
    )
    phases["population"].add(traffic, replies)
    ks = sorted(replies)
    client_rewards = {k: replies[k]["rewards"] for k in ks}
    rewards = combine_client_rewards(
        [client_rewards[k] for k in ks], [replies[k]["n"] for k in ks], [replies[k]["base"] for k in ks], cfg.combine
    )

    perts = [Direction.single(s, sg) for s, sg in zip(seeds, sigmas)]
    probe = FederatedProbe(pool, cfg, phases["probe"])
    base_probe = probe(None, "probe")[0]
    stages, cands, _ = merge_and_search(
        rewards, perts, params, probe, cfg, "probe", None, progress, None, ctx.run_dir, scheme, None
    )
    best = max(
        cands[cfg.merge_rules[0]], key=lambda c: c.probe_score
    )  # max keeps the first among ties (smaller q, beta, alpha)

    replies, traffic = pool.call(
        {k: {"op": "gate", "direction": best.direction.to_json(), "z": cfg.gate_z} for k in pool.alive}, "gate"
    )
    phases["gate"].add(traffic, replies)
    verdicts = {k: {key: replies[k][key] for key in ("accept", "n", "mean_gain", "lcb")} for k in sorted(replies)}
    accepts = sum(v["accept"] for v in verdicts.values())
    needed = math.ceil(cfg.min_accept * len(verdicts) - 1e-9)
    accepted = accepts >= needed
    reason = (
        f"candidate '{best.name}': {accepts} of {len(verdicts)} clients accept on their own validation shares "
        f"({len(verdicts) - accepts} veto(es)); deploy needs {needed}"
    ) + ("" if accepted else "; abstaining: the output is the base model")
    return _Outcome(client_rewards, rewards, perts, base_probe, stages, cands, best, verdicts, accepted, reason)


def _fedcorp_outputs(cfg: FedCorpConfig, ctx, out: _Outcome, direction, shares, phases, pool) -> Outputs:
    """Base and the deployed model on test (pooled and per client group), the probe table, bytes."""
    evals = run_evals(ctx)
    ids = ctx.example_ids("test")
    base_row, fed_row = cached_eval(ctx, evals, "test", None), cached_eval(ctx, evals, "test", direction)
    client_tokens = {t: sum(p.tokens[t] for p in phases.values()) for t in ("prompt_tokens", "generated_tokens")}
    method_ledger = ctx.ledger().add_generation(client_tokens["prompt_tokens"], client_tokens["generated_tokens"])
    labelled = sum(len(ctx.splits[s]) for s in CLIENT_SPLITS)
    label = NAME if out.accepted else f"{NAME} (abstained=base)"
    rows = method_rows(ctx.backend.n_params, label, base_row, fed_row, labelled, ids)
    per_client = _per_client_accuracy(
        ctx.splits["test"], cfg.clients, cfg.split_by, {"base": base_row["correct"], label: fed_row["correct"]}
    )
    communication = {p: ph.to_dict() for p, ph in phases.items()}
    total_bytes = sum(c["total_bytes"] for c in communication.values())
    fields = {
        "accepted": out.accepted,
        "reason": out.reason,
        "candidate": out.best.name,
        "verdicts": {str(k): v for k, v in out.verdicts.items()},
        "clients": cfg.clients,
        "split_by": cfg.split_by,
        "combine": cfg.combine,
        "client_shares": {s: [len(x) for x in shares[s]] for s in CLIENT_SPLITS},
        "client_rewards": {str(k): v for k, v in out.client_rewards.items()},
        "combined_rewards": out.rewards,
        "probe_base": out.base_probe,
        "probe_table": [{"candidate": "base", "probe_score": out.base_probe}]
        + [
            {"candidate": c.name, "probe_score": c.probe_score, **c.params}
            for r in cfg.merge_rules
            for c in out.cands[r]
        ],
        "stage1": [st.to_dict(out.perts) for st in out.stages],
        "per_client_test_accuracy": per_client,
        "dropped_clients": {str(k): v for k, v in pool.dropped.items()},
        "communication": communication,
        "total_bytes": total_bytes,
        "rounds_of_communication": 1,
        "method_ledger_note": (
            "every client's support scoring, probe and gate tokens (2N per token); the server's Gram matrix (noise "
            "from seeds, no tokens) and test evaluations not included"
        ),
    }
    phase_bytes = ", ".join(f"{p} {c['total_bytes']}" for p, c in communication.items())

    def notes(report: dict) -> list[str]:  # the recipe's size, as written
        return [
            out.reason,
            f"communication: {total_bytes} bytes in all ({phase_bytes}); recipe {report['recipe_bytes']} bytes",
        ]

    return Outputs(rows, [(label, "base")], ids, fields, method_ledger, "method_ledger", notes=notes)


def _per_client_accuracy(test, K: int, rule: str, outcomes: dict) -> list[dict]:
    """Accuracy of each row on the test examples of each client's group (the client split's rule
    applied to the server's test split; a group with no test example gets None)."""
    parts = partition_ids(test, K, rule)
    return [
        {
            "client": k,
            "n_test": len(p),
            **{name: (sum(int(c[i]) for i in p) / len(p) if p else None) for name, c in outcomes.items()},
        }
        for k, p in enumerate(parts)
    ]
