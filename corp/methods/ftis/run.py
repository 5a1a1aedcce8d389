"""`corp ftis`: train every node with F-TIS (and on-policy GRPO per node as the comparison arm),
evaluate per step, write the report."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import time

from corp.algorithms.grpo.trainer import (
    GRPOConfig,
)
from corp.algorithms.perturb import ParamFilter
from corp.algorithms.stats import PerExample
from corp.config import RunConfig, config_to_dict
from corp.errors import CorpError
from corp.evaluate.rewards import compute_rewards
from corp.evaluate.tasks import SplitSizes, get_task, make_splits
from corp.methods.ftis.config import NAME, FTISConfig
from corp.methods.ftis.node import Node, Rollout, same_tokenizer
from corp.runtime.backends import make_backend
from corp.runtime.context import cached_eval, eval_identity, eval_key, run_evals
from corp.runtime.ledger import Ledger
from corp.runtime.loop import Outputs, Steps, drive, run_steps
from corp.runtime.models import resolve_model
from corp.runtime.runs import ReportRow

# the comparison arm: each node alone trained with plain on-policy GRPO (`--loss grpo`, corp.algorithms.grpo),
# its rows node<K>-grpo; the name of a loss and of stored rows, not of the `corp grpo` command
BASELINE = "grpo"

# ---------------------------------------------------------------- one arm: F-TIS over all nodes, or GRPO on one


def _examples_for(cfg: FTISConfig, support, step: int):
    rng = random.Random(f"corp-ftis|{cfg.seed}|{step}")  # shared by every node: prompts are never sent
    return rng.sample(support, min(cfg.prompts_per_step, len(support)))


def _eval_steps(cfg: FTISConfig, last: int | None = None) -> list[int]:
    """The steps evaluated: 0, every --eval-every, and the last one (`last`: the step the nodes
    reached, which a run directory trained further than --max-steps holds: its model is evaluated, never
    a step it no longer has)."""
    last = cfg.steps if last is None else last
    return [s for s in range(last + 1) if s == 0 or (s <= cfg.steps and s % cfg.eval_every == 0) or s == last]


class _Arm(Steps):
    """One arm's loop for the shared driver: a step trains every node of the arm on the same prompts
    (each node's rollouts go to every other node) and logs one row per node; the state is each
    node's checkpoint (`ARM-nodeK.pt`), saved every --save-steps steps and after the last."""

    unit = key = "step"

    def __init__(self, arm: str, nodes: list[Node], cfg: FTISConfig, G: int, evals, trained_as: str, ood):
        self.arm, self.nodes, self.cfg, self.G = arm, nodes, cfg, G
        self.evals, self.trained_as, self.ood = evals, trained_as, ood
        self.desc = arm
        self.last = (
            cfg.steps
        )  # the last step evaluated; a checkpoint past --max-steps (trained further before) is reported as what it is
        self.metrics_path = nodes[0].ctx.run_dir / "metrics.jsonl"
        self.total = cfg.steps
        self.checkpoint_every = cfg.checkpoint_every
        self.index = {n.index for n in nodes}
        self.tokenizers = {n.index: n.tokenizer for n in nodes}

    def mine(self, row: dict) -> bool:
        return row.get("arm") == self.arm and row["node"] in self.index

    def resume(self) -> int:
        run_dir = self.nodes[0].ctx.run_dir
        for n in self.nodes:
            n.ckpt_path = run_dir / f"{self.arm}-node{n.index}.pt"
        if all(n.ckpt_path.exists() for n in self.nodes):
            for n in self.nodes:
                n.load_checkpoint()
            if len({n.step for n in self.nodes}) > 1:
                raise CorpError(
                    f"the {self.arm} checkpoints in '{run_dir}' are at different steps "
                    "(interrupted between two saves); use another --output-dir"
                )
        self.last = max(self.cfg.steps, self.nodes[0].step)
        for n in self.nodes:  # the weights as they are now (base, or the checkpoint's step)
            self.evaluate(n)
        return self.nodes[0].step

    def evaluate(self, n: Node) -> None:
        """Evaluate node n where it is now, when its step is one `_eval_steps` names."""
        compute = n.step in _eval_steps(self.cfg, self.last)
        _evaluate(self.arm, n, n.step, self.evals, self.trained_as, self.ood, compute=compute)

    def step(self, t: int) -> list[dict]:
        nodes, cfg = self.nodes, self.cfg
        t0 = time.perf_counter()
        ctx = nodes[0].ctx
        examples = _examples_for(cfg, ctx.splits["support"], t)
        rollouts: list[Rollout] = []
        for n in nodes:
            rollouts.extend(n.rollouts(examples, self.G, seed=cfg.seed * 1_000_003 + 7919 * n.index + t))
        rollouts.sort(key=lambda r: (r.prompt_index, r.sender))  # prompt-major: each prompt's mixed group together
        rewards, errors = compute_rewards(
            ctx.task, [r.text for r in rollouts], [examples[r.prompt_index] for r in rollouts], ctx.reward_fn
        )
        # every node computes the same rewards from the text and its own copy of the prompts: rewards are never sent
        sent = {
            n.index: sum(
                r.wire_bytes(not same_tokenizer(n.tokenizer, m.tokenizer))
                for r in rollouts
                if r.sender == n.index
                for m in nodes
                if m is not n
            )
            for n in nodes
        }
        rows = []
        for n in nodes:
            received_before = n.bytes_received
            n.bytes_sent += sent[n.index]
            stats = n.train_on(examples, rollouts, rewards, self.tokenizers, self.G * len(nodes))
            own = [x for x, r in zip(rewards, rollouts) if r.sender == n.index]
            rows.append(
                {
                    "arm": self.arm,
                    "node": n.index,
                    "model": n.name,
                    "step": n.step,
                    "reward": sum(rewards) / len(rewards),
                    "own_reward": sum(own) / len(own),
                    "reward_errors": errors,
                    **stats,
                    "bytes_sent": sent[n.index],
                    "bytes_received": n.bytes_received - received_before,
                    "seconds": time.perf_counter() - t0,
                    **{f"ledger_{k}": v for k, v in n.ledger.to_dict().items()},
                }
            )
        for n in nodes:
            self.evaluate(n)
        return rows

    def save(self) -> None:
        for n in self.nodes:
            n.save_checkpoint()

    def postfix(self, row: dict) -> dict:
        return {"reward": f"{row['reward']:.3f}"}


def _train_arm(arm: str, nodes: list[Node], cfg: FTISConfig, G: int, evals, trained_as: str, ood) -> list[dict]:
    """Train `nodes` together (F-TIS; a single node is on-policy GRPO) for cfg.steps steps, resumable
    from per-node checkpoints; evaluate at the steps `_eval_steps` names. Returns metric rows (one
    per node per step) and evaluation rows."""
    loop = _Arm(arm, nodes, cfg, G, evals, trained_as, ood)
    logged = run_steps(nodes[0].ctx, loop)
    rows = sorted(logged, key=lambda r: (r["node"], r["step"]))
    # every evaluation of the arm, read from the cache (each was computed when the node was at that step)
    for n in nodes:
        for s in _eval_steps(cfg, loop.last):
            rows.extend(_evaluate(arm, n, s, evals, trained_as, ood, compute=False))
    return rows


def _what(arm: str, n: Node, step: int, trained_as: str) -> str:
    return "base" if step == 0 else f"ftis|{arm}|node{n.index}|config={trained_as}|step={step}"


def _evaluate(arm: str, n: Node, step: int, evals, trained_as: str, ood, compute: bool) -> list[dict]:
    """Greedy test accuracy (and, at step 0 and the last step, OOD accuracy) of node n at `step`,
    through the run's evaluation cache. `compute`: evaluate the current weights if not cached
    (they must be the weights of `step`); else only read the cache."""

    cfg = n.cfg
    if cfg.skip_test_eval or n.index not in cfg.evaluated_nodes():
        return []
    targets = [("test", n.ctx)]
    if ood is not None and (step == 0 or step >= cfg.steps):
        targets.append(
            (
                "ood",
                dataclasses.replace(
                    n.ctx,
                    task=ood[0],
                    splits={**n.ctx.splits, "test": ood[1]},
                    _weights_hash=n.ctx.weights_hash,
                    lock=None,
                ),
            )
        )
    out = []
    what = _what(arm, n, step, trained_as)
    for split, c in targets:
        if compute:
            row = cached_eval(c, evals, "test", what=what, current=True, kind="checkpoint" if step else "base")
        else:
            row = evals.get(eval_key(eval_identity(c.eval_context(), what, c.example_ids("test"))))
            if row is None:
                continue
        out.append(
            {
                "kind": "eval",
                "arm": arm,
                "node": n.index,
                "step": step,
                "split": split,
                "accuracy": row["accuracy"],
                "row": row,
            }
        )
    return out


# ---------------------------------------------------------------- the command


def _node_context(cfg: FTISConfig, ctx, k: int, name: str):
    """Node k's run context: the run's, with its own model, backend and weights hash. A model that
    cannot be loaded is one line naming the node."""

    try:
        b = make_backend(cfg.backend, name, cfg.device, cfg.dtype, cfg.batch_size, ParamFilter(".*", ""))
    except CorpError as exc:
        raise CorpError(f"node {k} ('{name}'): {exc}") from None
    return dataclasses.replace(ctx, cfg=dataclasses.replace(cfg, model=name), _backend=b, _weights_hash=None, lock=None)


# not part of what trained the weights
_NOT_TRAINING = (
    "run_dir",
    "threads",
    "report_to",
    "eval_every",
    "ood_task",
    "skip_grpo_baseline",
    "skip_test_eval",
    "checkpoint_every",
    "eval_nodes",
)


def _trained_as(cfg: FTISConfig) -> str:
    """The key of the trained weights in the evaluation cache. Options that came with GRPOConfig enter it
    only away from their defaults, so a run keyed before F-TIS extended GRPOConfig keeps its key."""
    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    had = {
        "steps",
        "prompts_per_step",
        "num_generations",
        "temperature",
        "learning_rate",
        "epsilon",
        "loss_type",
        "grad_accum",
        "max_grad_norm",
        "skip_test_eval",
    }  # F-TIS's own fields before it extended GRPOConfig
    new = set(defaults) - had - {f.name for f in dataclasses.fields(RunConfig)}
    identity = {
        k: v for k, v in config_to_dict(cfg).items() if k not in _NOT_TRAINING and not (k in new and v == defaults[k])
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_ftis(cfg: FTISConfig) -> dict:
    """Train every node with F-TIS (and, unless --skip-grpo-baseline, on-policy GRPO per node alone), evaluate per step, write the report."""
    names = cfg.node_models()
    _check_models(names)
    needs = ("support",) if cfg.skip_test_eval else ("support", "test")
    ood = _ood_split(cfg)
    return drive(cfg, NAME, None, lambda ctx: _ftis(cfg, ctx, names, ood), needs=needs, defines=None)


def _ftis(cfg: FTISConfig, ctx, names: list[str], ood) -> Outputs:
    evals = run_evals(ctx)
    trained_as = _trained_as(cfg)
    node_ctxs = [_node_context(cfg, ctx, k, name) for k, name in enumerate(names)]
    if cfg.no_retokenize:  # before anything is computed: the run directory is removed, not left half-written
        _check_one_tokenizer(names, node_ctxs)
    hashes = [c.weights_hash for c in node_ctxs]  # the bases' hashes, before training changes the weights
    nodes = [Node(k, names[k], c, cfg) for k, c in enumerate(node_ctxs)]
    rows = _train_arm(NAME, nodes, cfg, cfg.num_generations, evals, trained_as, ood)
    reached = {NAME: nodes[0].step}  # the steps the models hold (more than --max-steps if trained further before)
    ledgers = {(NAME, n.index): n.ledger.to_dict() for n in nodes}
    traffic = {n.index: {"bytes_sent": n.bytes_sent, "bytes_received": n.bytes_received} for n in nodes}
    del nodes, node_ctxs  # free the trained models before the baseline reloads the bases
    if not cfg.skip_grpo_baseline:
        rows += _grpo_baseline(cfg, ctx, names, hashes, evals, trained_as, ood, reached, ledgers)
    return _outputs(cfg, ctx, names, rows, ledgers, traffic, hashes, reached)


def _check_models(names: list[str]) -> None:
    """Before the run directory exists: a missing model is one line, nothing written."""
    for k, name in enumerate(names):
        try:
            resolve_model(name)
        except CorpError as exc:
            raise CorpError(f"node {k} ('{name}'): {exc}") from None


def _ood_split(cfg: FTISConfig):
    """(task, test examples) of --ood-task, or None when there is none or test evaluation is off."""
    if not (cfg.ood_task and not cfg.skip_test_eval):
        return None
    otask = get_task(cfg.ood_task, cfg.data)
    ood = (otask, make_splits(otask, SplitSizes(0, 0, 0, cfg.n_test), cfg.split_seed)["test"])
    if not ood[1]:
        raise CorpError(f"--ood-task '{cfg.ood_task}' has no test examples")
    return ood


def _check_one_tokenizer(names: list[str], node_ctxs) -> None:
    """--no-retokenize: every node must share node 0's tokenizer (ids are sent as they are)."""
    toks = [c.backend.tokenizer for c in node_ctxs]
    for k, t in enumerate(toks[1:], 1):
        if not same_tokenizer(toks[0], t):
            raise CorpError(
                f"node 0 ('{names[0]}') and node {k} ('{names[k]}') use different tokenizers and "
                "--no-retokenize forbids sharing text; use nodes with one tokenizer or drop --no-retokenize"
            )


def _grpo_baseline(cfg, ctx, names, hashes, evals, trained_as, ood, reached, ledgers) -> list[dict]:
    """The comparison arm: each node alone, from its base weights (reloaded and checked against the
    hash taken at the start), with K x G own completions per prompt. Fills `reached` and `ledgers`."""
    rows = []
    for k, name in enumerate(names):
        c = _node_context(cfg, ctx, k, name)
        if c.weights_hash != hashes[k]:
            raise CorpError(
                f"node {k} ('{name}') reloaded with other weights than at the start of the run; its files changed"
            )
        node = Node(k, name, c, cfg)
        rows += _train_arm(BASELINE, [node], cfg, cfg.num_generations * len(names), evals, trained_as, ood)
        reached[(BASELINE, k)] = node.step
        ledgers[(BASELINE, k)] = node.ledger.to_dict()
        del node, c
    return rows


def _node_rows(cfg, ctx, names, evals, ledgers, reached, ids) -> tuple[list[ReportRow], list[tuple[str, str]]]:
    """Per node: base, F-TIS and GRPO on the test split, and the comparisons between them."""
    report_rows, compare = [], []
    for k, name in enumerate(names):

        def at(arm, step, split="test", k=k):  # k bound here: `at` is called within this iteration only
            return next(
                (r for r in evals if r["arm"] == arm and r["node"] == k and r["split"] == split and r["step"] == step),
                None,
            )

        for label, r, trained in (
            (f"node{k}-base", at(NAME, 0), False),
            (f"node{k}-{NAME}", at(NAME, reached[NAME]), True),
            (f"node{k}-{BASELINE}", at(BASELINE, reached.get((BASELINE, k), cfg.steps)), True),
        ):
            if r is None:
                continue
            ev = r["row"]
            led = Ledger(ledgers[(NAME, k)]["n_params"]).add_generation(ev["prompt_tokens"], ev["generated_tokens"])
            report_rows.append(
                ReportRow(
                    label,
                    ev["accuracy"],
                    1,
                    led,
                    len(ctx.splits["support"]) if trained else 0,
                    PerExample(ev["correct"], ids),
                    detail={"model": name, "step": r["step"]},
                )
            )
        compare += [(f"node{k}-{NAME}", f"node{k}-{BASELINE}"), (f"node{k}-{NAME}", f"node{k}-base")]
    return report_rows, compare


def _outputs(cfg, ctx, names, rows, ledgers, traffic, hashes, reached) -> Outputs:
    """report.json: per node, rows base / ftis / grpo on the test split (each row's ledger: its test
    generation; the training ledgers are under `nodes`), accuracy per step, OOD accuracy, bytes."""
    ids = ctx.example_ids("test") if not cfg.skip_test_eval else None
    evals = [r for r in rows if r.get("kind") == "eval"]
    report_rows, compare = _node_rows(cfg, ctx, names, evals, ledgers, reached, ids)
    per_step: dict[str, dict[int, float]] = {}
    for r in evals:
        per_step.setdefault(f"node{r['node']}-{r['arm']}-{r['split']}", {})[r["step"]] = r["accuracy"]
    step_rows = [r for r in rows if r.get("kind") != "eval"]
    fields = dict(
        reconstruction=(
            "F-TIS, arXiv 2605.22537: a reconstruction from docs/methods.md (choices stated in corp/methods/ftis/)"
        ),
        steps=reached[NAME],
        # every party's compute toward F-TIS's models: the sum over nodes, each at its own model's size
        # (corp bench charges a cell this; the per-node ledgers are under `nodes`)
        method_flops=sum(ledgers[(NAME, k)]["flops"] for k in range(len(names))),
        method_ledger_parties=_parties(names, ledgers),
        method_ledger_note=(
            "F-TIS, all nodes: each node's generation of its rollouts and the forward pass for their logprobs (2N per "
            "token) and its training on the mixed group (6N per prompt + completion token), N its own model's size; "
            "test evaluations and the GRPO comparison arm not included"
        ),
        nodes=_nodes(names, hashes, ledgers, traffic),
        accuracy_per_step=per_step,
        per_step=step_rows,
        settings=_settings(cfg, len(names)),
        matching_note=(
            "nodeK-grpo: node K alone from its base, same steps and prompts, K x G own completions per prompt (same "
            "number of local updates and of trained sequences per update); its FLOPs are in "
            "nodes[].grpo_training_ledger beside F-TIS's training_ledger"
        ),
        bytes_note=(
            "ids + float32 logprobs (8 B/token) to a node with the same tokenizer; UTF-8 text + float32 sequence "
            "logprob + 1 B finished flag otherwise; prompts and rewards are never sent"
        ),
    )
    return Outputs(report_rows, compare, ids if report_rows else None, fields, model_name=cfg.nodes or cfg.model)


def _parties(names, ledgers) -> list[dict]:
    """Each node's share of F-TIS's compute, at its own model's size."""
    return [
        {
            "node": k,
            "model": n,
            "n_params": ledgers[(NAME, k)]["n_params"],
            "flops": ledgers[(NAME, k)]["flops"],
        }
        for k, n in enumerate(names)
    ]


def _nodes(names, hashes, ledgers, traffic) -> list[dict]:
    """Per node: its base's hash, the training ledgers of both arms and the bytes it exchanged."""
    return [
        {
            "node": k,
            "model": n,
            "weights_hash": hashes[k],
            "training_ledger": ledgers.get((NAME, k)),
            "grpo_training_ledger": ledgers.get((BASELINE, k)),
            **traffic.get(k, {}),
        }
        for k, n in enumerate(names)
    ]


def _settings(cfg, n_nodes: int) -> dict:
    """The run's F-TIS settings, and GRPO's clipping and reward scaling where they are not the defaults."""
    return {
        "tis_cap": cfg.tis_cap,
        "kl_filter": cfg.kl_filter,
        "num_generations_per_node": cfg.num_generations,
        "mixed_group": cfg.num_generations * n_nodes,
        "learning_rate": cfg.learning_rate,
        "epsilon": cfg.epsilon,
        "ood_task": cfg.ood_task,
        "temperature": cfg.temperature,
        **{
            k: getattr(cfg, k)
            for k in ("epsilon_high", "scale_rewards")
            if getattr(cfg, k) != GRPOConfig.__dataclass_fields__[k].default
        },
    }


def summary(report: dict) -> str:
    """Terminal text: per node accuracy per step and traffic, then the table."""
    lines = []
    for key, acc in sorted(report.get("accuracy_per_step", {}).items()):
        lines.append(
            f"{key:<24} " + "  ".join(f"step {s}: {a:.3f}" for s, a in sorted(acc.items(), key=lambda t: int(t[0])))
        )
    for n in report.get("nodes", []):
        lines.append(
            f"node{n['node']} ({n['model']}): sent {n.get('bytes_sent', 0)} "
            f"B, received {n.get('bytes_received', 0)} B over the run"
        )
    if report.get("table"):
        lines.append(report["table"])
    lines.append(f"run directory: {report['run_dir']}")
    return "\n".join(lines)
