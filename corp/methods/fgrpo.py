"""FGRPO (`corp fgrpo`): federated GRPO on non-IID client shares with adaptive aggregation.

Paper: "FGRPO" (arXiv 2606.03094), federated GRPO on non-IID client data. Reconstruction from the
abstract and secondary notes (docs/methods.md, "FGRPO"); the paper's exact aggregation formula and
schedule are not public. What runs here:
- K clients, each with its own share of the support split (corp.runtime.clients.split_clients:
  by arith operator, by answer length, or iid). Every round each client starts from the global
  weights and runs E = --local-steps local GRPO steps with corp's GRPO trainer (corp/algorithms/grpo/trainer.py,
  GRPOTrainer.train_step, unchanged: same sampling, advantages, loss variants, LoRA), sending back
  its update Delta_k, its mean training reward R_k over the E steps, its share size and its token
  counts (nothing else: no text, no example ids).
- Aggregation `fgrpo`: baseline b_k = EMA (--ema 0.9) of client k's past rewards, relative gain
  g_k = (R_k - b_k) / (|b_k| + eps), alpha_k = softmax(g_k / tau); `fedavg`: alpha_k = n_k / sum n.
  global += sum_k alpha_k Delta_k (corp.algorithms.aggregation).
Departures, and why:
- A client's first round has no history: its gain is 0 (b_k starts at R_k).
- With LoRA (--lora-r > 0, the default on CPU) the trained parameters are the LoRA factors A, B and
  the updates are aggregated factor by factor (as FedIT-style federated LoRA does): sum_k a_k B_k A_k
  is not (sum a_k B_k)(sum a_k A_k), an approximation the paper's setting may not make.
- Each round a client's AdamW state starts fresh (FedAvg's usual choice; optimizer moments are not
  communicated).
- A client that dies mid-round is dropped for the rest of the run; the round aggregates the
  clients that answered, weights renormalised over them (corp/runtime/clients.py).
Per round: pooled greedy accuracy of the global model on the server's test split, the same split
by each client's group (the client split's rule applied to the test examples), bytes each way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import ClassVar

import torch

from corp.algorithms.aggregation import ema_update, fedavg_weights, fgrpo_weights, relative_gains, weighted_sum
from corp.algorithms.grpo.trainer import GRPOConfig, GRPOTrainer
from corp.algorithms.perturb.noise import derive_seeds
from corp.config import config_to_dict
from corp.errors import CorpError
from corp.evaluate.rewards import resolve_reward
from corp.evaluate.tasks import get_task
from corp.extras import require
from corp.method import ITERATIVE, SMALL, BenchAdapter, Method, opt
from corp.runtime.clients import SPLIT_RULES, ClientBase, ClientPool, check_signatures, partition_ids, split_clients
from corp.runtime.context import RunContext, cached_eval, run_evals
from corp.runtime.ledger import Ledger
from corp.runtime.loop import Outputs, Steps, drive, method_rows, run_steps
from corp.runtime.runs import atomic_write_with

NAME = "fgrpo"  # the command, the report's method and its trained row
AGGREGATIONS = ("fgrpo", "fedavg")
STATE_FILE = "fgrpo_state.pt"


@dataclass
class FGRPOConfig(GRPOConfig):
    steps: int = 1
    """E: local GRPO steps each client runs per round, from the global weights."""
    lora_r: int = 8
    """LoRA rank (0 trains and sends all parameters)."""
    rounds: int = 2
    """Communication rounds."""
    clients: int = 3
    """K: number of clients; each gets its own share of the support split."""
    split_by: str = "op"
    """How support examples are dealt to clients: op (arith operator: non-IID, needs e.g. arith:ops=+-*), answer-length (non-IID by answer digits) or iid."""
    aggregation: str = "fgrpo"
    """fgrpo (softmax of each client's relative reward gain over its EMA baseline) or fedavg (weights by data size)."""
    tau: float = 1.0
    """Softmax temperature of the fgrpo aggregation weights."""
    ema: float = 0.9
    """Decay of each client's reward baseline (EMA of its past round rewards)."""
    executor: str = "local"
    """Where clients run: local (built in this process, called in turn) or ray (one Ray actor, i.e. process, per client)."""
    ray_address: str | None = None
    """Join this Ray cluster instead of starting a local Ray (--executor ray)."""

    local_only: ClassVar[str | None] = None  # its clients are Ray actors under --executor ray
    # every client trains a model of its own (its GRPO trainer: a host model beside its engine), in this
    # process or in its actor: the memory check counts them beside the server's
    client_models: ClassVar[tuple[str, ...]] = ("local", "ray")
    client_host_copy: ClassVar[str | None] = "beside"
    options: ClassVar[dict[str, str]] = {"steps": "local_steps"}  # E per round, not a run's max_steps

    def validate(self) -> FGRPOConfig:
        super().validate()
        if self.rounds < 1:
            raise CorpError(f"--rounds must be >= 1, got {self.rounds}")
        if self.clients < 1:
            raise CorpError(f"--clients must be >= 1, got {self.clients}")
        if self.split_by not in SPLIT_RULES:
            raise CorpError(f"--split-by '{self.split_by}' is unknown; choose one of {', '.join(SPLIT_RULES)}")
        if self.aggregation not in AGGREGATIONS:
            raise CorpError(f"--aggregation '{self.aggregation}' is unknown; choose one of {', '.join(AGGREGATIONS)}")
        if not 0 < self.tau < math.inf:
            raise CorpError(f"--tau must be > 0 and finite, got {self.tau}")
        if not 0.0 <= self.ema < 1.0:
            raise CorpError(f"--ema must be in [0, 1), got {self.ema}")
        if self.executor not in ("local", "ray"):
            raise CorpError(f"unknown --executor '{self.executor}'; choose one of local, ray")
        if self.executor == "ray":
            require(
                "ray", "--executor ray"
            )  # before anything is computed: a missing Ray is one line, no run directory left
        return self


# ---------------------------------------------------------------- the client


class FGRPOClient(ClientBase):
    """One FGRPO client: its support share, its own model copy and GRPO trainer."""

    def __init__(self, cfg: FGRPOConfig, index: int, support: list, run_dir: str):
        # its own sampling seed, so clients do not draw in lockstep
        self.cfg = dataclasses.replace(cfg, seed=derive_seeds("fgrpo-client", cfg.seed, index, n=1)[0])
        self.index, self.support, self.run_dir = index, support, Path(run_dir)
        self._trainer = None

    def trainer(self) -> GRPOTrainer:
        if self._trainer is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            ctx = RunContext(
                self.cfg,
                "fgrpo-client",
                get_task(self.cfg.task, self.cfg.data),
                {"support": list(self.support)},
                self.run_dir,
                resolve_reward(self.cfg.reward),
            )
            self._trainer = GRPOTrainer(ctx, self.cfg)
        return self._trainer

    def op_hello(self, msg: dict) -> dict:

        return {"signature": get_task(self.cfg.task, self.cfg.data).signature(), "n_support": len(self.support)}

    def op_round(self, msg: dict) -> dict:
        tr = self.trainer()
        state = msg["state"]
        names = [n for n, _ in tr.trainable]
        if sorted(state) != sorted(names):
            raise CorpError(
                f"client {self.index}: the global state holds other "
                "parameters than its model trains (LoRA settings differ?)"
            )
        with torch.no_grad():
            for n, p in tr.trainable:
                p.copy_(state[n])
        # fresh local optimizer each round (moments are not communicated); the step counter fixes which prompts it draws
        tr.optimizer = torch.optim.AdamW([p for _, p in tr.trainable], lr=self.cfg.learning_rate, weight_decay=0.0)
        tr.step = int(msg["round"]) * self.cfg.steps
        before = tr.ledger.to_dict()
        rewards = [tr.train_step()["reward"] for _ in range(self.cfg.steps)]
        after = tr.ledger.to_dict()
        delta = {n: (p.detach().float() - state[n].float()).contiguous() for n, p in tr.trainable}
        return {
            "delta": delta,
            "reward": float(sum(rewards) / len(rewards)),
            "n_examples": len(self.support),
            "tokens": {k: int(after[k] - before[k]) for k in ("prompt_tokens", "generated_tokens", "trained_tokens")},
        }


# ---------------------------------------------------------------- the server


def run_fgrpo(cfg: FGRPOConfig, backend=None, log=None) -> dict:
    """`log(client, 'down'|'up', message)` sees every message (tests)."""
    needs = ("support",) if cfg.skip_test_eval else ("support", "test")
    return drive(cfg, NAME, backend, lambda ctx: _fgrpo(cfg, ctx, log), needs=needs, defines=None)


class FGRPOServer(Steps):
    """The server's loop for the shared driver: a step is one communication round (every client
    trains from the global weights, the server aggregates their updates); the state is the global
    trainable weights, each client's reward baseline and the dropped clients (fgrpo_state.pt)."""

    desc, unit, key = NAME, "round", "round"

    def __init__(self, cfg: FGRPOConfig, ctx, trained_as: str, test_eval, parts: list):
        self.cfg, self.ctx, self.trained_as, self.test_eval, self.parts = cfg, ctx, trained_as, test_eval, parts
        self.metrics_path = ctx.run_dir / "rounds.jsonl"
        self.state_path = ctx.run_dir / STATE_FILE
        self.total = cfg.rounds
        torch.manual_seed(cfg.seed)  # the global LoRA initialisation (the server's), the same on resume
        self.server = GRPOTrainer(ctx, cfg)  # holds the global weights; never trains
        self.pool: ClientPool | None = None
        if self.state_path.exists():
            self.st = torch.load(self.state_path, map_location="cpu", weights_only=True)
            if self.st["trained_as"] != trained_as:
                raise CorpError(f"'{ctx.run_dir}' holds an FGRPO run with other settings; use another --output-dir")
        else:
            self.st = {
                "trained_as": trained_as,
                "round": 0,
                "global": {n: p.detach().clone() for n, p in self.server.trainable},
                "baselines": [None] * cfg.clients,
                "dropped": {},
            }

    def load_global(self) -> None:
        with torch.no_grad():
            for n, p in self.server.trainable:
                p.copy_(self.st["global"][n])
        # an engine with weights of its own (vLLM) generates with what it was last given: without this
        # push every test evaluation of the global model there was the base's (the server never steps)
        self.server.sync_engine(force=True)

    def resume(self) -> int:
        return self.st["round"]  # loaded when the server was built (before the base was evaluated)

    def step(self, r: int) -> dict:
        st, pool, cfg = self.st, self.pool, self.cfg
        replies, traffic = pool.call(
            {k: {"op": "round", "round": r, "state": st["global"]} for k in pool.alive}, f"round {r + 1}"
        )
        ks = sorted(replies)
        R = [float(replies[k]["reward"]) for k in ks]
        b = [st["baselines"][k] for k in ks]
        if cfg.aggregation == "fgrpo":
            weights = fgrpo_weights(R, b, cfg.tau)
        else:
            weights = fedavg_weights([int(replies[k]["n_examples"]) for k in ks])
        update = weighted_sum([replies[k]["delta"] for k in ks], weights)
        st["global"] = {n: (st["global"][n].float() + update[n]).to(st["global"][n].dtype) for n in st["global"]}
        for k, rk in zip(ks, R):
            st["baselines"][k] = ema_update(st["baselines"][k], rk, cfg.ema)
        st["round"] = r + 1
        st["dropped"] = {str(k): v for k, v in pool.dropped.items()}
        self.load_global()
        row = self.test_eval(f"round={r + 1}")
        tokens = {
            t: sum(int(replies[k]["tokens"][t]) for k in ks)
            for t in ("prompt_tokens", "generated_tokens", "trained_tokens")
        }
        n_params = self.ctx.backend.n_params
        return {
            "round": r + 1,
            "clients": ks,
            "rewards": R,
            "baselines_before": b,
            "gains": relative_gains(R, b),
            "weights": weights,
            "aggregation": cfg.aggregation,
            "communication": traffic.to_dict(),
            "client_tokens": tokens,
            "client_flops": Ledger(
                n_params, tokens["prompt_tokens"], tokens["generated_tokens"], tokens["trained_tokens"]
            ).flops,
            "dropped": dict(st["dropped"]),
            "pooled_test_accuracy": None if row is None else row["accuracy"],
            "client_test_accuracy": None
            if row is None
            else [sum(int(row["correct"][i]) for i in p) / len(p) if p else None for p in self.parts],
        }

    def save(self) -> None:
        atomic_write_with(self.state_path, lambda f: torch.save(self.st, f))

    def postfix(self, row: dict) -> dict:
        acc = row["pooled_test_accuracy"]
        return {
            "reward": f"{sum(row['rewards']) / len(row['rewards']):.3f}",
            **({"test": f"{acc:.3f}"} if acc is not None else {}),
        }


def _fgrpo(cfg: FGRPOConfig, ctx, log) -> Outputs:
    K = cfg.clients
    shares = split_clients(ctx.splits["support"], K, cfg.split_by, "support")
    _ = ctx.weights_hash  # the base's hash, before the server's copy gets adapters
    evals = run_evals(ctx)
    # `rounds` is left out: round r's state does not depend on how many rounds follow, so a rerun
    # with more --rounds continues this run (as corp bench grows it) instead of being refused
    skip = ("run_dir", "threads", "report_to", "executor", "ray_address", "rounds")
    settings = {k: v for k, v in config_to_dict(cfg).items() if k not in skip}
    trained_as = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def test_eval(label: str):
        if cfg.skip_test_eval:
            return None
        return cached_eval(
            ctx, evals, "test", what=f"fgrpo|config={trained_as}|{label}", current=True, kind="checkpoint"
        )

    parts = partition_ids(ctx.splits["test"], K, cfg.split_by) if not cfg.skip_test_eval else []
    loop = FGRPOServer(cfg, ctx, trained_as, test_eval, parts)
    loop.load_global()
    base = (
        None if cfg.skip_test_eval else cached_eval(ctx, evals, "test", what="base", current=True, kind="checkpoint")
    )  # LoRA B = 0: the base
    factories = [partial(FGRPOClient, cfg, k, shares[k], str(ctx.run_dir / "clients" / str(k))) for k in range(K)]
    loop.pool = pool = ClientPool(factories, cfg.executor, log=log, ray_address=cfg.ray_address)
    pool.dropped = {int(k): v for k, v in loop.st["dropped"].items()}
    try:
        if loop.st["round"] < cfg.rounds:
            replies, _ = pool.call({k: {"op": "hello"} for k in pool.alive}, "hello")
            check_signatures([ctx.task.signature()] + [replies[k]["signature"] for k in sorted(replies)])
        history = run_steps(ctx, loop)
    finally:
        pool.close()

    st, server = loop.st, loop.server
    loop.load_global()
    final = test_eval(f"round={st['round']}")
    model = server.merged_model()
    server.backend.model = model
    return _fgrpo_outputs(cfg, ctx, loop, history, base, final, shares, (model, server.tokenizer))


def _fgrpo_outputs(
    cfg: FGRPOConfig, ctx, loop: FGRPOServer, history: list[dict], base, final, shares, model
) -> Outputs:
    """The report: base and final global model on test, every round's row, bytes and client compute."""
    st, server, K = loop.st, loop.server, cfg.clients
    n_params = ctx.backend.n_params
    total = {
        t: sum(h["client_tokens"][t] for h in history) for t in ("prompt_tokens", "generated_tokens", "trained_tokens")
    }
    training = Ledger(n_params, total["prompt_tokens"], total["generated_tokens"], total["trained_tokens"])
    ids = ctx.example_ids("test") if not cfg.skip_test_eval else None
    rows = [] if base is None else method_rows(n_params, NAME, base, final, len(ctx.splits["support"]), ids)
    total_bytes = sum(h["communication"]["total_bytes"] for h in history)
    fields = {
        "rounds": history,
        "aggregation": cfg.aggregation,
        "clients": K,
        "split_by": cfg.split_by,
        "client_shares": [len(s) for s in shares],
        "dropped_clients": st["dropped"],
        "lora_r": cfg.lora_r,
        "trainable_params": sum(p.numel() for _, p in server.trainable),
        "total_bytes": total_bytes,
        "bytes_per_round": [h["communication"]["total_bytes"] for h in history],
        "method_ledger_note": (
            "all clients' generation (2N per token) and training tokens (6N per "
            "token, also for LoRA); the server's test evaluations not included"
        ),
    }

    def notes(_: dict) -> list[str]:
        return [
            f"round {h['round']}: pooled test accuracy {h['pooled_test_accuracy']:.3f}; per client "
            f"{h['client_test_accuracy']}; weights {[round(w, 3) for w in h['weights']]}; "
            f"{h['communication']['total_bytes']} bytes"
            for h in history
        ] + [f"communication: {total_bytes} bytes in all; client compute {training.flops:.3e} FLOPs"]

    compare = [(NAME, "base")] if rows else []
    return Outputs(rows, compare, ids, fields, training, "method_ledger", model=model, notes=notes)


def _clients_get_support(cfg, splits: dict) -> None:
    """Before compute: every client gets support examples (the split refuses one that would not)."""
    split_clients(splits["support"], cfg.clients, cfg.split_by, "support")


METHOD = Method(
    NAME,
    FGRPOConfig,
    run_fgrpo,
    "FGRPO: K clients run E local GRPO steps per round on private non-IID "
    "shares; the server aggregates updates by relative reward gain (or FedAvg).",
    model=True,
    smoke={
        **SMALL,
        "rounds": 2,
        "steps": 1,
        "clients": 2,
        "split_by": "iid",
        "prompts_per_step": 2,
        "num_generations": 2,
        "lora_r": 2,
        "learning_rate": 1e-3,
    },
    # one round: every client runs `steps` local GRPO steps of prompts_per_step * num_generations completions
    bench=BenchAdapter(
        ITERATIVE,
        NAME,  # the trained row
        flops=("method_flops",),
        equal_data=True,
        unit="rounds",
        units_done="rounds",
        unit_evals=lambda o: (
            float(opt(o, FGRPOConfig, "clients"))
            * float(opt(o, FGRPOConfig, "steps"))
            * float(opt(o, FGRPOConfig, "prompts_per_step"))
            * float(opt(o, FGRPOConfig, "num_generations"))
            / max(1.0, float(opt(o, FGRPOConfig, "n_support")))
        ),
        check=_clients_get_support,
        touched=lambda o, seed, units: None,  # each client samples its own share: not reconstructed here
        reached=lambda got: f"{got['units']:.3g} rounds",
    ),
)
