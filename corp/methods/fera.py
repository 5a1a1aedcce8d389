"""FERA: training-free federated reasoning with uncertainty-aware aggregation. Paper: arXiv
2605.10082. RECONSTRUCTION from docs/methods.md ("FERA"), itself built from the abstract; no
public code. This is the cheap variant docs/methods.md names for small models: an uncertainty-weighted
vote over the clients' final answers.

Why the cheap variant: in the paper the server cross-checks the clients' conflicting reasoning
steps and writes a refined solution. A 135M or 270M model cannot do that reliably (it rarely keeps
a multi-step derivation consistent, let alone judges two), so a synthesis written by it would be
noise. The server here only aggregates answers, and its "synthesis" is the winning answer with its
support, which is what it sends back.

One round t = 1..R (`corp fera`), for every test question:
- client c (K clients, one model; clients differ by their private demonstrations: `--shots`
  solved examples from c's share of the support split, dealt by `--split-by`: iid round-robin,
  or non-IID by arith operator / answer length, with the federated helpers' `split_clients`) answers with its
  demonstrations, the question, and from round 2 the server's previous synthesis as context;
- it samples `--num-generations` completions and reports its answer (the most common extracted answer) and
  an uncertainty u_c: `disagreement` = 1 - (votes for that answer / samples), or `entropy` = the
  mean token entropy of its greedy completion (needs the in-process model; bits not nats is
  irrelevant: T absorbs the scale);
- the server weights clients w_c = softmax(-u_c / T) (`--temperature-u`), adds w_c to the client's
  answer (clients without an answer abstain), and the answer with the largest total wins; ties go
  to the answer of the least uncertain client. The synthesis is sent back to every client.
Only answers and one scalar per client cross (bytes are counted per round); demonstrations never
leave their client. Reported per round: the synthesis's accuracy, each client's accuracy, and the
unweighted vote over the clients' answers (the same answers, weights all equal) so that the effect
of the uncertainty weights is visible.

Departures: one model for all clients (the paper's clients may differ); answers, not steps, are
aggregated (above); the prompt wording is ours.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

from corp.algorithms.grpo.trainer import build_batch, token_logps_and_entropy
from corp.algorithms.stats import PerExample
from corp.config import RunConfig, config_to_dict, flag
from corp.errors import CorpError
from corp.method import FIXED, SMALL, BenchAdapter, Method, opt
from corp.runtime.backends.base import MODEL
from corp.runtime.clients import split_clients
from corp.runtime.ledger import Ledger
from corp.runtime.loop import Outputs, Steps, drive, run_steps
from corp.runtime.runs import ReportRow, read_jsonl

NAME = "fera"  # the command, the report's method and its rows' prefix

UNCERTAINTIES = ("disagreement", "entropy")


@dataclass
class FERAConfig(RunConfig):
    clients: int = 4
    """K: clients, each holding a private share of the support split."""
    split_by: str = "iid"
    """How the support split is dealt to clients (corp.runtime.clients): iid, op (arith operators) or answer-length."""
    shots: int = 2
    """Demonstrations per client (solved examples from its share) in every prompt it writes."""
    rounds: int = 3
    """Rounds: answer, aggregate, send the synthesis back."""
    samples: int = 4
    """Completions each client samples per question (its answer is their most common; disagreement among them is its uncertainty)."""
    sample_temperature: float = 0.7
    """Sampling temperature of the clients."""
    uncertainty: str = "disagreement"
    """Client uncertainty: disagreement (1 - majority share of its samples) or entropy (mean token entropy of its greedy answer)."""
    temperature_u: float = 0.2
    """T in the server's client weights softmax(-u / T); small T trusts the most certain client more."""

    options: ClassVar[dict[str, str]] = {"samples": "num_generations"}  # TRL's name for completions per prompt

    def validate(self) -> FERAConfig:
        super().validate()
        for name in ("clients", "shots", "rounds", "samples"):
            if getattr(self, name) < 1:
                raise CorpError(f"{flag(name, self)} must be >= 1, got {getattr(self, name)}")
        if self.uncertainty not in UNCERTAINTIES:
            raise CorpError(f"--uncertainty '{self.uncertainty}' is unknown; choose one of {', '.join(UNCERTAINTIES)}")
        if not (self.temperature_u > 0 and math.isfinite(self.temperature_u)):
            raise CorpError(f"--temperature-u must be > 0 and finite, got {self.temperature_u}")
        if not 0 < self.sample_temperature < math.inf:
            raise CorpError(
                f"--sample-temperature must be > 0 and finite (clients sample), got {self.sample_temperature}"
            )
        if self.uncertainty == "disagreement" and self.samples < 2:
            raise CorpError("--uncertainty disagreement needs --num-generations >= 2")
        return self


# ---------------------------------------------------------------- the server (no model needed)


def client_weights(uncertainties: list[float], temperature: float) -> list[float]:
    """softmax(-u / T) over clients (stable)."""
    z = [-u / temperature for u in uncertainties]
    m = max(z)
    e = [math.exp(v - m) for v in z]
    s = sum(e)
    return [v / s for v in e]


def synthesise(
    answers: list[str | None], uncertainties: list[float], temperature: float
) -> tuple[str | None, dict[str, float]]:
    """The server's answer: the uncertainty-weighted vote (clients with no answer abstain; ties go to
    the least uncertain client's answer). Returns (answer, total weight per answer)."""
    w = client_weights(uncertainties, temperature)
    totals: dict[str, float] = {}
    for a, wc in zip(answers, w):
        if a is not None:
            totals[a] = totals.get(a, 0.0) + wc
    if not totals:
        return None, totals
    best = max(totals.values())
    tied = {a for a, v in totals.items() if v >= best - 1e-12}
    by_certainty = sorted((u, c) for c, (a, u) in enumerate(zip(answers, uncertainties)) if a in tied)
    return answers[by_certainty[0][1]], totals


def plain_vote(answers: list[str | None]) -> str | None:
    """Unweighted vote over the clients' answers (first-seen wins a tie), the comparison row."""
    counts = Counter(a for a in answers if a is not None)
    return counts.most_common(1)[0][0] if counts else None


def client_answer(extracted: list[str | None]) -> tuple[str | None, float]:
    """A client's answer (the most common extracted one) and its disagreement 1 - share of that answer."""
    counts = Counter(a for a in extracted if a is not None)
    if not counts:
        return None, 1.0
    ans, votes = counts.most_common(1)[0]
    return ans, 1.0 - votes / len(extracted)


# ---------------------------------------------------------------- prompts


def client_prompt(demos, question: str, synthesis: str | None, support: float | None) -> str:
    lines = ["Here are solved examples."]
    for d in demos:
        lines += [f"Question: {d.prompt}", f"Answer: {d.answer}", ""]
    lines.append(f"Question: {question}")
    if synthesis is not None:
        lines.append(
            f"(Other solvers' combined answer last round: {synthesis}, "
            f"with {support:.0%} of the weight. Check it and answer.)"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- the command


def _mean_entropy(backend, prompts: list[str], completions: list[list[int]]) -> list[float]:
    """Mean token entropy of each completion under the in-process model (logits at temperature 1)."""
    import torch

    from corp.runtime.backends.hf import format_prompt

    backend.require(MODEL, "--uncertainty entropy")
    tok = backend.tokenizer
    out = []
    for s in range(0, len(prompts), backend_batch(backend)):
        ps = [
            tok(format_prompt(tok, p), add_special_tokens=False)["input_ids"]
            for p in prompts[s : s + backend_batch(backend)]
        ]
        cs = [c or [tok.eos_token_id] for c in completions[s : s + backend_batch(backend)]]
        b = build_batch(tok, ps, cs, torch.zeros(len(cs)), torch.zeros(len(cs), dtype=torch.long))
        with torch.no_grad():
            _, ent = token_logps_and_entropy(
                backend.model, b.input_ids, b.attention_mask, b.completion_mask.size(1), 1.0
            )
        m = b.completion_mask.float()
        out.extend(((ent * m).sum(-1) / m.sum(-1).clamp(min=1)).tolist())
    return out


def backend_batch(backend) -> int:
    return max(1, getattr(backend, "batch_size", 8))


def run_fera(cfg: FERAConfig, backend=None) -> dict:
    """R rounds of FERA's uncertainty-weighted vote on the test split; accuracy per round."""
    return drive(cfg, NAME, backend, lambda ctx: _fera(cfg, ctx), defines=None)


def _fera(cfg: FERAConfig, ctx) -> Outputs:
    # the federated helpers' split: one line for an empty share
    shares = split_clients(ctx.splits["support"], cfg.clients, cfg.split_by)
    for c, share in enumerate(shares):
        if len(share) < cfg.shots:
            raise CorpError(
                f"client {c} holds {len(share)} support examples, fewer than --shots {cfg.shots}; raise "
                f"--n-support to >= {cfg.clients * cfg.shots} or lower --clients/--shots"
            )
    demos = [share[: cfg.shots] for share in shares]
    test = ctx.splits["test"]
    ids = ctx.example_ids("test")
    run_as = hashlib.sha256(
        json.dumps(
            {
                **{
                    k: v
                    for k, v in config_to_dict(cfg).items()
                    if k not in ("run_dir", "threads", "report_to", "batch_size")
                },
                "weights_hash": ctx.weights_hash,
                "model_id": ctx.model_id,
            },
            sort_keys=True,
            default=str,
        ).encode()
    ).hexdigest()[:16]
    rounds = run_steps(ctx, FERARounds(cfg, ctx, demos, test, run_as))
    return _outputs(cfg, ctx, rounds, ids)


class FERARounds(Steps):
    """FERA's rounds for the shared driver. The state is the log itself: a round's row holds the
    synthesis and support the next round sends, and the ledger so far (rows of other settings in
    the same log, told apart by `run_as`, are left alone)."""

    desc, unit, key = NAME, "round", "round"

    def __init__(self, cfg: FERAConfig, ctx, demos, test, run_as: str):
        self.cfg, self.ctx, self.demos, self.test, self.run_as = cfg, ctx, demos, test, run_as
        self.metrics_path = ctx.run_dir / "rounds.jsonl"
        self.total = cfg.rounds
        self.synth: list[str | None] = [None] * len(test)
        self.support: list[float | None] = [None] * len(test)
        self.ledger = ctx.ledger()

    def mine(self, row: dict) -> bool:
        return row.get("run_as") == self.run_as

    def resume(self) -> int:
        done = {r["round"]: r for r in read_jsonl(self.metrics_path, key="round") if self.mine(r)}
        t = 0
        while t + 1 in done:  # resumed: synthesis, support and ledger go on from the last round done
            t += 1
            self.synth, self.support = done[t]["synthesis"], done[t]["synthesis_support"]
            led = done[t]["ledger"]
            self.ledger = Ledger(led["n_params"], led["prompt_tokens"], led["generated_tokens"])
        return t

    def step(self, t: int) -> dict:
        row = _round(self.ctx, self.cfg, t + 1, self.demos, self.test, self.synth, self.support, self.ledger)
        row["run_as"] = self.run_as
        self.synth, self.support = row["synthesis"], row["synthesis_support"]
        return row

    def save(self) -> None:
        """Nothing beyond the row: the logged round is the state."""


def _round(ctx, cfg: FERAConfig, t: int, demos, test, synth, support, ledger) -> dict:
    K, n = cfg.clients, len(test)
    answers = [[None] * n for _ in range(K)]
    unc = [[1.0] * n for _ in range(K)]
    up_bytes = down_bytes = 0
    for c in range(K):
        prompts = [client_prompt(demos[c], e.prompt, synth[i], support[i]) for i, e in enumerate(test)]
        gens = ctx.backend.generate(
            prompts,
            ctx.max_new_tokens,
            temperature=cfg.sample_temperature,
            n=cfg.samples,
            seed=cfg.seed * 1_000_003 + 101 * t + c,
            stop=ctx.task.stop or None,
        )
        ledger.add_generation(sum(gens.prompt_tokens), sum(gens.generated_tokens))
        extracted = [ctx.task.extract(x) for x in gens.texts]
        for i in range(n):
            answers[c][i], unc[c][i] = client_answer(extracted[i * cfg.samples : (i + 1) * cfg.samples])
        if cfg.uncertainty == "entropy":
            greedy = ctx.backend.generate(prompts, ctx.max_new_tokens, temperature=0.0, stop=ctx.task.stop or None)
            ledger.add_generation(sum(greedy.prompt_tokens), sum(greedy.generated_tokens))
            unc[c] = _mean_entropy(ctx.backend, prompts, greedy.token_ids)
            ledger.add_generation(sum(greedy.prompt_tokens) + sum(greedy.generated_tokens), 0)
        up_bytes += sum(
            len((a or "").encode()) + 4 for a in answers[c]
        )  # answer text + float32 uncertainty per question
    new_synth, new_support, weights = [], [], []
    for i in range(n):
        col_a, col_u = [answers[c][i] for c in range(K)], [unc[c][i] for c in range(K)]
        a, totals = synthesise(col_a, col_u, cfg.temperature_u)
        new_synth.append(a)
        new_support.append(totals.get(a, 0.0) if a is not None else 0.0)
        weights.append(client_weights(col_u, cfg.temperature_u))
    down_bytes = K * sum(len((a or "").encode()) + 4 for a in new_synth)  # synthesis + its support, to every client
    check = lambda a, e: bool(ctx.task.check(a, e))  # noqa: E731
    plain = [plain_vote([answers[c][i] for c in range(K)]) for i in range(n)]
    return {
        "round": t,
        "synthesis": new_synth,
        "synthesis_support": new_support,
        "synthesis_correct": [int(check(a, e)) for a, e in zip(new_synth, test)],
        "plain_vote": plain,
        "plain_vote_correct": [int(check(a, e)) for a, e in zip(plain, test)],
        "client_answers": answers,
        "client_uncertainty": unc,
        "client_correct": [[int(check(a, e)) for a, e in zip(answers[c], test)] for c in range(K)],
        "mean_weights": [sum(w[c] for w in weights) / n for c in range(K)],
        "bytes_up": up_bytes,
        "bytes_down": down_bytes,
        "ledger": ledger.to_dict(),
    }


def _outputs(cfg: FERAConfig, ctx, rounds: list[dict], ids: list[str]) -> Outputs:
    acc = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    per_pass = cfg.clients * cfg.samples * (2 if cfg.uncertainty == "entropy" else 1)
    rows = []
    for r in rounds:
        led = r["ledger"]  # cumulative: every generation up to and including this round
        for name, correct in (
            (f"{NAME}-round{r['round']}", r["synthesis_correct"]),
            (f"plain-vote-round{r['round']}", r["plain_vote_correct"]),
        ):
            rows.append(
                ReportRow(
                    name,
                    acc(correct),
                    per_pass * r["round"],
                    Ledger(led["n_params"], led["prompt_tokens"], led["generated_tokens"]),
                    cfg.clients * cfg.shots,
                    PerExample(correct, ids),
                )
            )
    last = rounds[-1]["round"]
    compare = (
        [(f"{NAME}-round{last}", f"plain-vote-round{last}"), (f"{NAME}-round{last}", f"{NAME}-round1")]
        if last > 1
        else [(f"{NAME}-round1", "plain-vote-round1")]
    )
    fields = dict(
        reconstruction=(
            "FERA, arXiv 2605.10082: a reconstruction from docs/methods.md; "
            "the cheap uncertainty-weighted vote (see corp/methods/fera.py)"
        ),
        rounds=[
            {
                "round": r["round"],
                "accuracy": acc(r["synthesis_correct"]),
                "plain_vote_accuracy": acc(r["plain_vote_correct"]),
                "client_accuracy": [acc(c) for c in r["client_correct"]],
                "mean_client_weights": r["mean_weights"],
                "mean_client_uncertainty": [sum(u) / len(u) for u in r["client_uncertainty"]],
                "bytes_up": r["bytes_up"],
                "bytes_down": r["bytes_down"],
            }
            for r in rounds
        ],
        settings={
            "clients": cfg.clients,
            "shots": cfg.shots,
            "samples": cfg.samples,
            "uncertainty": cfg.uncertainty,
            "temperature_u": cfg.temperature_u,
            "sample_temperature": cfg.sample_temperature,
        },
        passes_note="passes/ex: completions per test question up to that round, all clients together",
    )
    return Outputs(rows, compare, ids, fields)


def summary(report: dict) -> str:
    lines = [f"{'round':>5} {'FERA acc':>8} {'plain vote':>10}  client acc | mean weight"]
    for r in report["rounds"]:
        clients = "  ".join(f"{a:.2f}|{w:.2f}" for a, w in zip(r["client_accuracy"], r["mean_client_weights"]))
        lines.append(f"{r['round']:>5} {r['accuracy']:>8.3f} {r['plain_vote_accuracy']:>10.3f}  {clients}")
    lines += [report.get("table", ""), f"run directory: {report['run_dir']}"]
    return "\n".join(lines)


METHOD = Method(
    NAME,
    FERAConfig,
    run_fera,
    "FERA (reconstruction, cheap variant): training-free rounds; clients answer with private demonstrations + the "
    "server's synthesis; uncertainty-weighted vote.",
    smoke={**SMALL, "clients": 2, "shots": 1, "rounds": 2, "samples": 2},
    summary=summary,
    # FERA trains nothing: its rounds cost inference only, reported per row as passes per test example
    bench=BenchAdapter(
        FIXED,
        rf"{NAME}-round\d+|plain-vote-round\d+",
        row_names=lambda o: [
            f"{p}-round{r}" for r in range(1, int(opt(o, FERAConfig, "rounds")) + 1) for p in (NAME, "plain-vote")
        ],
        touched=lambda o, seed, units: None,
    ),
)
