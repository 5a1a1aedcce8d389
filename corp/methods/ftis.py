"""F-TIS: decentralised GRPO across heterogeneous models that share rollouts, with truncated
importance sampling. Paper: arXiv 2605.22537. RECONSTRUCTION: no public code exists; this follows
docs/methods.md ("F-TIS"), itself built from the abstract and secondary notes.

What a run does (`corp ftis`): K nodes, each with its own model (`--nodes a,b`; default two nodes of
`--model`), answer the same prompts each step (drawn from the support split by a seed all nodes
share, so prompts are never sent). Every node samples G completions per prompt and broadcasts them
with its per-token log-probabilities: token ids + float32 logprobs (8 bytes a token) to a node with
the same tokenizer, else the UTF-8 text + its float32 sequence log-probability. Node k then takes
one GRPO step on the mixed group of K x G completions per prompt:
- advantages are group-relative over all K x G completions (GRPO's (R - mean) / (std + 1e-4));
- per token, the clipped GRPO loss of an off-policy completion (another node's) is multiplied by
  the truncated importance weight w_t = min(pi_old(a_t) / mu(a_t), C), detached (C = --tis-cap);
  the node's own completions have w_t = 1 (mu = pi_old: they were sampled from these weights);
- filter: an off-policy completion is kept if its advantage is positive or its KL from the
  generator, summed over its tokens, is below gamma (--kl-filter); otherwise it is dropped (weight 0).

Choices of ours (the paper's are not public), each stated:
- KL(pi_old || mu) per completion is estimated from the generator's own sample as
  sum_t (r_t log r_t - r_t + 1), r_t = pi_old(a_t) / mu(a_t): non-negative per token and unbiased
  for KL(pi || mu) under samples from mu (E_mu[r - 1] = 0). Log-ratios are clamped to +-50 first
  (such a completion is far above any gamma anyway).
- Across tokenizers (`--no-retokenize` forbids it): the receiver re-tokenises the sender's text
  (appending its own EOS when the sender's completion ended with EOS) and, since the sender's
  per-token logprobs do not align with local tokens, defines mu per LOCAL token as the sender's
  reported sequence log-probability spread evenly: log mu_t = log mu(text) / T_local. The product
  of the per-token ratios is then exactly pi_old(text) / mu(text); per token it is an approximation.
- Built on corp grpo (corp.grpo.trainer): FTISConfig extends GRPOConfig and a node is a
  GRPOTrainer (optimizer set-up, checkpoint, micro-batch step) whose per-token loss is F-TIS's.
  num_iterations = 1 (pi_old = the current weights, detached), no KL penalty to a reference, no
  LoRA, no loss variant (those GRPO options are refused, UNSUPPORTED): the policy-gradient part is
  exactly corp grpo's per-token loss, so with only on-policy completions the loss equals plain
  GRPO's (and TRL's; tests/test_ftis.py). --epsilon-high and --scale-rewards work as in corp grpo.
- The sender's logprobs come from one forward pass over its own completions after generation (the
  HF backend's generate does not return them; a vLLM sender would), counted as inference FLOPs.
- Comparison arm (on unless `--skip-grpo-baseline`): each node alone, from its own base weights, runs
  on-policy GRPO for the same number of steps on the same prompts with K x G completions of its own
  per prompt, i.e. the same number of local updates and the same number of trained sequences per
  update; its FLOPs differ (it generates all of them itself, F-TIS recomputes others' logprobs),
  and both ledgers are reported so the comparison at matched FLOPs can be read off.
- Compute: `method_flops` is every node's ledger summed (each at its own model's size: generation,
  the logprob forward, training on the mixed group), the cost of F-TIS's models; `corp bench`
  charges it to node 0's row (its bench adapter, METHOD below). A run resumed with more --max-steps continues
  from the per-node checkpoints (weights, AdamW state, ledgers, traffic) and equals one run for the
  larger count (tests/test_bench_ftis.py); a checkpoint past --max-steps is reported at its own step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import time
from dataclasses import dataclass

import torch

from corp import CorpError
from corp.config import RunConfig, config_to_dict, flag
from corp.evaluate.rewards import compute_rewards
from corp.grpo.trainer import (
    GRPOConfig,
    GRPOTrainer,
    build_batch,
    drawn_positions,
    group_advantages,
    per_token_loss,
    token_logps_and_entropy,
)
from corp.ledger import Ledger
from corp.method import ITERATIVE, SMALL, BenchAdapter, Method, opt, option_default
from corp.models import resolve_model
from corp.runs import ReportRow, format_rows, read_jsonl, write_report
from corp.stats import PerExample

LOGRATIO_CLAMP = 50.0
ID_BYTES, LOGPROB_BYTES, SEQ_LOGPROB_BYTES = 4, 4, 4  # int32 token ids, float32 logprobs


# GRPO options F-TIS does not have, each refused unless at its default (never silently ignored), and why
UNSUPPORTED = {
    "loss": "its per-token loss is plain GRPO's times the truncated importance weight; "
    "the cov / reco variants are not defined on a mixed group",
    "beta": "it has no KL penalty to a reference model",
    "num_iterations": "it takes one step per generated batch (pi_old = the current weights)",
    "lora_r": "its nodes train all parameters (no LoRA)",
    "lora_alpha": "its nodes train all parameters (no LoRA)",
    "lora_targets": "its nodes train all parameters (no LoRA)",
}


@dataclass
class FTISConfig(GRPOConfig):
    nodes: str = ""
    """Comma-separated models, one per node (aliases, directories or hub ids); default: --n-nodes copies of --model."""
    n_nodes: int = 2
    """Number of nodes when --nodes is not given (each samples with its own seed)."""
    steps: int = 3
    """Optimizer steps per node."""
    prompts_per_step: int = 2
    """Distinct prompts per step, the same for every node."""
    num_generations: int = 12
    """G: completions each node samples per prompt (the paper's group size 12); the mixed group has K x G."""
    checkpoint_every: int = 1
    """Save every node's resumable checkpoint every this many steps (and at the end)."""
    tis_cap: float = 2.0
    """C: truncated importance weight min(pi_old / mu, C) on off-policy tokens."""
    kl_filter: float = 50.0
    """gamma: an off-policy completion with advantage <= 0 and summed KL from its generator >= gamma is dropped (paper ablates 5, 10)."""
    no_retokenize: bool = False
    """Refuse to share text across tokenizers (then every node must use the same tokenizer)."""
    skip_grpo_baseline: bool = False
    """Do not run the comparison arm: on-policy GRPO per node alone (same steps, prompts and K x G own completions per prompt)."""
    ood_task: str | None = None
    """A second task for out-of-distribution accuracy before and after training (its first --n-test test examples)."""
    eval_every: int = 1
    """Evaluate greedy test accuracy of every node every this many steps (and at the end)."""
    skip_test_eval: bool = False
    """Do not evaluate on the test split (and OOD task) at all."""
    eval_nodes: str = ""
    """Comma-separated indices of the nodes evaluated on the test split (default: every node); `corp bench` evaluates
    node 0 only, the one its row reports (the others' evaluations would only feed this run's own report)."""

    def validate(self) -> FTISConfig:
        defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
        for name, why in UNSUPPORTED.items():  # before GRPO's checks: the first line says what F-TIS lacks
            if getattr(self, name) != defaults[name]:
                given = f"{flag(name, self)} {getattr(self, name)}"
                raise CorpError(f"{given}: corp ftis does not support it ({why}); drop it")
        super().validate()
        for name in ("eval_every", "n_nodes"):
            if getattr(self, name) < 1:
                raise CorpError(f"{flag(name, self)} must be >= 1, got {getattr(self, name)}")
        if len(self.node_models()) < 2:
            raise CorpError(
                f"--nodes '{self.nodes}' names one model; F-TIS needs "
                "two or more nodes (or drop --nodes and use --n-nodes)"
            )
        if not (self.tis_cap > 0 and math.isfinite(self.tis_cap)):
            raise CorpError(f"--tis-cap must be > 0 and finite, got {self.tis_cap}")
        if not self.kl_filter > 0:
            raise CorpError(f"--kl-filter must be > 0, got {self.kl_filter}")
        self.evaluated_nodes()  # a bad --eval-nodes is one line before any model loads
        return self

    def evaluated_nodes(self) -> list[int]:
        """The node indices --eval-nodes names (every node when empty)."""
        k = len(self.node_models())
        if not self.eval_nodes.strip():
            return list(range(k))
        try:
            picked = sorted({int(x) for x in self.eval_nodes.split(",") if x.strip()})
        except ValueError:
            picked = [-1]
        if not picked or picked[0] < 0 or picked[-1] >= k:
            raise CorpError(
                f"--eval-nodes '{self.eval_nodes}' must name node indices between 0 and {k - 1} (comma-separated)"
            )
        return picked

    def check_group(self) -> None:
        # the group is the mixed one of K x G >= 2 completions, so one per node is enough; a last
        # micro-batch shorter than the others is allowed (GRPOTrainer.micro_batch_step)
        if self.num_generations < 1:
            raise CorpError(f"--num-generations must be >= 1, got {self.num_generations}")

    def node_models(self) -> list[str]:
        if self.nodes.strip():
            return [m.strip() for m in self.nodes.split(",") if m.strip()]
        return [self.model] * self.n_nodes


# ---------------------------------------------------------------- the math (no model needed)


def tis_weights(old_logps: torch.Tensor, mu_logps: torch.Tensor, off_policy: torch.Tensor, cap: float) -> torch.Tensor:
    """(B, T) truncated importance weights min(pi_old / mu, C) on off-policy rows, 1 on on-policy rows; detached."""
    ratio = torch.exp((old_logps - mu_logps).clamp(-LOGRATIO_CLAMP, LOGRATIO_CLAMP)).clamp(max=cap)
    return torch.where(off_policy.bool().unsqueeze(1), ratio, torch.ones_like(ratio)).detach()


def generator_kl(old_logps: torch.Tensor, mu_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) KL(pi_old || mu) of each completion, summed over its tokens, estimated from mu's own
    sample: sum_t r log r - r + 1 with r = pi_old / mu (see the module docstring)."""
    log_r = (old_logps - mu_logps).clamp(-LOGRATIO_CLAMP, LOGRATIO_CLAMP)
    r = torch.exp(log_r)
    return ((r * log_r - r + 1) * mask.to(r.dtype)).sum(-1)


def keep_mask(advantages: torch.Tensor, kl: torch.Tensor, off_policy: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B,) True where a completion is trained on: on-policy, or advantage > 0, or KL < gamma."""
    return ~off_policy.bool() | (advantages > 0) | (kl < gamma)


def ftis_token_loss(
    logps, old_logps, mu_logps, advantages, mask, off_policy, eps_low: float, eps_high: float, cap: float, gamma: float
):
    """F-TIS per-token loss (B, T) before aggregation, and (weights, keep, kl) for logging.

    GRPO's clipped per-token loss (corp.grpo.trainer.per_token_loss, no KL term) times the
    detached truncated importance weight, with filtered completions weighted 0."""
    old = old_logps.detach()
    w = tis_weights(old, mu_logps, off_policy, cap)
    kl = generator_kl(old, mu_logps, mask)
    keep = keep_mask(advantages, kl, off_policy, gamma)
    loss = per_token_loss(logps, old, advantages, mask, eps_low, eps_high) * w * keep.to(w.dtype).unsqueeze(1)
    return loss, w, keep, kl


# ---------------------------------------------------------------- messages between nodes


@dataclass
class Rollout:
    """One completion as its generator broadcasts it."""

    sender: int
    prompt_index: int
    token_ids: list[int]
    text: str
    logprobs: list[float]  # the generator's per-token log-probabilities (logits / temperature)
    finished: bool  # ended with the generator's EOS

    def wire_bytes(self, as_text: bool) -> int:
        """What crosses the wire to one receiver: ids + logprobs, or text + sequence logprob + finished flag."""
        if as_text:
            return len(self.text.encode("utf-8")) + SEQ_LOGPROB_BYTES + 1
        return len(self.token_ids) * (ID_BYTES + LOGPROB_BYTES)


_SAME: dict[tuple[int, int], tuple[object, object, bool]] = {}


def same_tokenizer(a, b) -> bool:
    """Whether token ids mean the same text for both (same class and vocabulary). Memoised per pair
    of objects (the entry holds both, so an id is never reused by another tokenizer while cached)."""
    if a is b:
        return True
    hit = _SAME.get((id(a), id(b)))
    if hit is None or hit[0] is not a or hit[1] is not b:
        hit = _SAME[(id(a), id(b))] = (a, b, type(a).__name__ == type(b).__name__ and a.get_vocab() == b.get_vocab())
    return hit[2]


# ---------------------------------------------------------------- a node


class Node(GRPOTrainer):
    """One party: GRPO's trainer (its model trained in place, optimizer, ledger, checkpoint and
    micro-batch step) with F-TIS's per-token loss, plus its index, run context and traffic counters."""

    purpose = "corp ftis (nodes train in process)"

    def __init__(self, index: int, name: str, ctx, cfg: FTISConfig):
        self.index, self.name = index, name
        super().__init__(ctx, cfg)
        self.bytes_sent = self.bytes_received = 0

    @property
    def checkpoint_mismatch(self) -> str:
        return f"was made for another model than node {self.index} ('{self.name}'); use another --output-dir"

    def extra_state(self) -> dict:
        return {"bytes": [self.bytes_sent, self.bytes_received]}

    def load_extra_state(self, state: dict) -> None:
        self.bytes_sent, self.bytes_received = state["bytes"]

    def prompt_ids(self, prompt: str) -> list[int]:
        return self.tokenizer(self.format_prompt(self.tokenizer, prompt), add_special_tokens=False)["input_ids"]

    @torch.no_grad()
    def completion_logps(self, prompts: list[str], completions: list[list[int]]) -> list[list[float]]:
        """Per-token logprobs of given completions under the current weights, in micro-batches of the
        training forward's shape (left-padded prompt, right-padded completion), so an own completion's
        mu equals the training pass's pi_old."""
        out: list[list[float]] = []
        micro = max(1, len(prompts) // self.cfg.grad_accum)
        self.policy.eval()
        for s in range(0, len(prompts), micro):
            pids = [self.prompt_ids(p) for p in prompts[s : s + micro]]
            comps = completions[s : s + micro]
            b = build_batch(
                self.tokenizer, pids, comps, torch.zeros(len(comps)), torch.zeros(len(comps), dtype=torch.long)
            )
            lp, _ = token_logps_and_entropy(
                self.policy,
                b.input_ids,
                b.attention_mask,
                b.completion_mask.size(1),
                self.cfg.temperature,
                with_entropy=False,
            )
            out.extend(lp[r, : len(c)].tolist() for r, c in enumerate(comps))
            self.ledger.add_generation(sum(b.prompt_lens) + sum(b.completion_lens), 0)
        return out

    def rollouts(self, examples, n: int, seed: int) -> list[Rollout]:
        """n completions per example, prompt-major, with this node's logprobs of its own tokens."""
        self.policy.eval()
        self.sync_engine()  # an engine with weights of its own (vLLM) generates with this step's weights
        gens = self.backend.generate(
            [e.prompt for e in examples],
            self.ctx.max_new_tokens,
            temperature=self.cfg.temperature,
            n=n,
            seed=seed,
            stop=self.ctx.task.stop or None,
        )  # as evaluation and corp grpo do
        self.ledger.add_generation(sum(gens.prompt_tokens), sum(gens.generated_tokens))
        prompts = [e.prompt for e in examples for _ in range(n)]
        lps = self.completion_logps(prompts, gens.token_ids)
        eos = self.backend.eos_ids
        return [
            Rollout(self.index, i // n, ids, text, lp, bool(ids) and ids[-1] in eos)
            for i, (ids, text, lp) in enumerate(zip(gens.token_ids, gens.texts, lps))
        ]

    def receive(self, r: Rollout, sender_tokenizer) -> tuple[list[int], list[float], bool]:
        """(local completion ids, mu per local token, off-policy) of a rollout; counts the bytes."""
        if r.sender == self.index:
            return r.token_ids, r.logprobs, False
        if same_tokenizer(sender_tokenizer, self.tokenizer):
            self.bytes_received += r.wire_bytes(as_text=False)
            return r.token_ids, r.logprobs, True
        if self.cfg.no_retokenize:
            raise CorpError(
                f"node {self.index} ('{self.name}') and node {r.sender} use different tokenizers and --no-retokenize "
                "forbids sharing text; use nodes with one tokenizer or drop --no-retokenize"
            )
        self.bytes_received += r.wire_bytes(as_text=True)
        ids = self.tokenizer(r.text, add_special_tokens=False)["input_ids"]
        if r.finished and self.tokenizer.eos_token_id is not None:
            ids = ids + [self.tokenizer.eos_token_id]
        seq_lp = float(sum(r.logprobs))
        return (
            ids,
            [seq_lp / max(1, len(ids))] * len(ids),
            True,
        )  # mu spread evenly over local tokens (module docstring)

    def train_on(
        self, examples, rollouts: list[Rollout], rewards: list[float], tokenizers: dict[int, object], group: int
    ) -> dict:
        """One optimizer step on the mixed group (rollouts prompt-major, `group` per prompt): GRPO's
        micro-batch step with F-TIS's per-token loss."""
        cfg = self.cfg
        received = [self.receive(r, tokenizers[r.sender]) for r in rollouts]
        adv = group_advantages(torch.tensor(rewards, dtype=torch.float32), group, cfg.scale_rewards == "group")
        pids = [self.prompt_ids(examples[r.prompt_index].prompt) for r in rollouts]
        batch = build_batch(
            self.tokenizer, pids, [c for c, _, _ in received], adv, torch.tensor([r.prompt_index for r in rollouts])
        )
        T = batch.completion_mask.size(1)
        mu = torch.zeros(len(rollouts), T)
        for row, (_c, lp, _) in enumerate(received):
            mu[row, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
        off = torch.tensor([o for _, _, o in received])
        eps_high = cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high
        kept, kls, acc = [], [], {"w_sum": 0.0, "w_n": 0.0, "capped": 0.0}

        def token_loss(sl: slice, mb, logps: torch.Tensor, _ent, mask: torch.Tensor) -> torch.Tensor:
            # on-policy rows: mu is pi_old by construction (the same weights sampled them)
            mu_mb = torch.where(off[sl].unsqueeze(1), mu[sl], logps.detach())
            tok, w, keep, kl = ftis_token_loss(
                logps,
                logps.detach(),
                mu_mb,
                mb.advantages,
                mask,
                off[sl],
                cfg.epsilon,
                eps_high,
                cfg.tis_cap,
                cfg.kl_filter,
            )
            kept.extend(keep[off[sl]].tolist())
            kls.extend(kl[off[sl]].tolist())
            offm = mask * off[sl].float().unsqueeze(1)
            acc["w_sum"] += float((w * offm).sum())
            acc["w_n"] += float(offm.sum())
            acc["capped"] += float(((w >= cfg.tis_cap) * offm).sum())
            return tok

        losses, grad_norm = self.micro_batch_step(batch, token_loss, with_entropy=False)
        self.policy.eval()
        self.step += 1
        w_n = acc["w_n"]
        return {
            "loss": sum(losses),
            "grad_norm": grad_norm,
            "off_policy": int(off.sum()),
            "off_policy_kept": int(sum(kept)),
            "tis_weight_mean": acc["w_sum"] / w_n if w_n else None,
            "off_policy_kl_median": sorted(kls)[len(kls) // 2] if kls else None,
            "tis_capped_share": acc["capped"] / w_n if w_n else None,
        }


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


def _train_arm(arm: str, nodes: list[Node], cfg: FTISConfig, G: int, evals, trained_as: str, ood) -> list[dict]:
    """Train `nodes` together (F-TIS; a single node is on-policy GRPO) for cfg.steps steps, resumable
    from per-node checkpoints; evaluate at the steps `_eval_steps` names. Returns metric rows (one
    per node per step) and evaluation rows."""
    run_dir = nodes[0].ctx.run_dir
    for n in nodes:
        n.ckpt_path = run_dir / f"{arm}-node{n.index}.pt"
    if all(n.ckpt_path.exists() for n in nodes):
        for n in nodes:
            n.load_checkpoint()
        if len({n.step for n in nodes}) > 1:
            raise CorpError(
                f"the {arm} checkpoints in '{run_dir}' are at different steps "
                "(interrupted between two saves); use another --output-dir"
            )
    metrics_path = run_dir / "metrics.jsonl"
    done = nodes[0].step
    last = max(cfg.steps, done)  # a checkpoint past --max-steps (trained further before) is reported as what it is
    index = {n.index for n in nodes}
    logged = {
        (r["node"], r["step"]): r
        for r in read_jsonl(metrics_path, key="step")
        if r.get("arm") == arm and r["node"] in index and r["step"] <= done
    }
    tokenizers = {n.index: n.tokenizer for n in nodes}
    for n in nodes:  # the weights as they are now (base, or the checkpoint's step)
        _evaluate(arm, n, n.step, evals, trained_as, ood, compute=n.step in _eval_steps(cfg, last))
    while nodes[0].step < cfg.steps:
        t0 = time.perf_counter()
        step = nodes[0].step
        examples = _examples_for(cfg, nodes[0].ctx.splits["support"], step)
        rollouts: list[Rollout] = []
        for n in nodes:
            rollouts.extend(n.rollouts(examples, G, seed=cfg.seed * 1_000_003 + 7919 * n.index + step))
        rollouts.sort(key=lambda r: (r.prompt_index, r.sender))  # prompt-major: each prompt's mixed group together
        ctx = nodes[0].ctx
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
        for n in nodes:
            received_before = n.bytes_received
            n.bytes_sent += sent[n.index]
            stats = n.train_on(examples, rollouts, rewards, tokenizers, G * len(nodes))
            own = [x for x, r in zip(rewards, rollouts) if r.sender == n.index]
            row = {
                "arm": arm,
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
            nodes[0].ctx.log_row(metrics_path, row)  # also to --report-to, live
            logged[(n.index, n.step)] = row
        if nodes[0].step % cfg.checkpoint_every == 0 or nodes[0].step == cfg.steps:
            for n in nodes:
                n.save_checkpoint()
        for n in nodes:
            _evaluate(arm, n, n.step, evals, trained_as, ood, compute=n.step in _eval_steps(cfg, last))
    rows = [logged[k] for k in sorted(logged)]
    # every evaluation of the arm, read from the cache (each was computed when the node was at that step)
    for n in nodes:
        for s in _eval_steps(cfg, last):
            rows.extend(_evaluate(arm, n, s, evals, trained_as, ood, compute=False))
    return rows


def _what(arm: str, n: Node, step: int, trained_as: str) -> str:
    return "base" if step == 0 else f"ftis|{arm}|node{n.index}|config={trained_as}|step={step}"


def _evaluate(arm: str, n: Node, step: int, evals, trained_as: str, ood, compute: bool) -> list[dict]:
    """Greedy test accuracy (and, at step 0 and the last step, OOD accuracy) of node n at `step`,
    through the run's evaluation cache. `compute`: evaluate the current weights if not cached
    (they must be the weights of `step`); else only read the cache."""
    from corp.evaluate.context import cached_eval, eval_identity, eval_key

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
    from corp.evaluate.backends import make_backend
    from corp.perturb import ParamFilter

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
    from corp.evaluate.context import open_run, run_evals
    from corp.evaluate.tasks import SplitSizes, get_task, make_splits

    names = cfg.node_models()
    for k, name in enumerate(names):  # before the run directory exists: a missing model is one line, nothing written
        try:
            resolve_model(name)
        except CorpError as exc:
            raise CorpError(f"node {k} ('{name}'): {exc}") from None
    needs = ("support",) if cfg.skip_test_eval else ("support", "test")
    ood = None
    if cfg.ood_task and not cfg.skip_test_eval:
        otask = get_task(cfg.ood_task, cfg.data)
        ood = (otask, make_splits(otask, SplitSizes(0, 0, 0, cfg.n_test), cfg.split_seed)["test"])
        if not ood[1]:
            raise CorpError(f"--ood-task '{cfg.ood_task}' has no test examples")
    with open_run(cfg, "ftis", None, needs=needs, defines=None) as ctx:
        evals = run_evals(ctx)
        trained_as = _trained_as(cfg)
        node_ctxs = [_node_context(cfg, ctx, k, name) for k, name in enumerate(names)]
        if cfg.no_retokenize:  # before anything is computed: the run directory is removed, not left half-written
            toks = [c.backend.tokenizer for c in node_ctxs]
            for k, t in enumerate(toks[1:], 1):
                if not same_tokenizer(toks[0], t):
                    raise CorpError(
                        f"node 0 ('{names[0]}') and node {k} ('{names[k]}') use different tokenizers and "
                        "--no-retokenize forbids sharing text; use nodes with one tokenizer or drop --no-retokenize"
                    )
        hashes = [c.weights_hash for c in node_ctxs]  # the bases' hashes, before training changes the weights
        nodes = [Node(k, names[k], c, cfg) for k, c in enumerate(node_ctxs)]
        rows = _train_arm("ftis", nodes, cfg, cfg.num_generations, evals, trained_as, ood)
        reached = {"ftis": nodes[0].step}  # the steps the models hold (more than --max-steps if trained further before)
        ledgers = {("ftis", n.index): n.ledger.to_dict() for n in nodes}
        traffic = {n.index: {"bytes_sent": n.bytes_sent, "bytes_received": n.bytes_received} for n in nodes}
        del nodes, node_ctxs  # free the trained models before the baseline reloads the bases
        if not cfg.skip_grpo_baseline:
            for k, name in enumerate(names):  # each node alone, from its base weights (reloaded and checked)
                c = _node_context(cfg, ctx, k, name)
                if c.weights_hash != hashes[k]:
                    raise CorpError(
                        f"node {k} ('{name}') reloaded with other weights "
                        "than at the start of the run; its files changed"
                    )
                node = Node(k, name, c, cfg)
                rows += _train_arm("grpo", [node], cfg, cfg.num_generations * len(names), evals, trained_as, ood)
                reached[("grpo", k)] = node.step
                ledgers[("grpo", k)] = node.ledger.to_dict()
                del node, c
        return _report(cfg, ctx, names, rows, ledgers, traffic, hashes, reached)


def _report(cfg, ctx, names, rows, ledgers, traffic, hashes, reached) -> dict:
    """report.json: per node, rows base / ftis / grpo on the test split (each row's ledger: its test
    generation; the training ledgers are under `nodes`), accuracy per step, OOD accuracy, bytes."""
    ids = ctx.example_ids("test") if not cfg.skip_test_eval else None
    evals = [r for r in rows if r.get("kind") == "eval"]
    report_rows, compare = [], []
    for k, name in enumerate(names):

        def at(arm, step, split="test", k=k):  # k bound here: `at` is called within this iteration only
            return next(
                (r for r in evals if r["arm"] == arm and r["node"] == k and r["split"] == split and r["step"] == step),
                None,
            )

        for label, r, trained in (
            (f"node{k}-base", at("ftis", 0), False),
            (f"node{k}-ftis", at("ftis", reached["ftis"]), True),
            (f"node{k}-grpo", at("grpo", reached.get(("grpo", k), cfg.steps)), True),
        ):
            if r is None:
                continue
            ev = r["row"]
            led = Ledger(ledgers[("ftis", k)]["n_params"]).add_generation(ev["prompt_tokens"], ev["generated_tokens"])
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
        compare += [(f"node{k}-ftis", f"node{k}-grpo"), (f"node{k}-ftis", f"node{k}-base")]
    per_step: dict[str, dict[int, float]] = {}
    for r in evals:
        per_step.setdefault(f"node{r['node']}-{r['arm']}-{r['split']}", {})[r["step"]] = r["accuracy"]
    step_rows = [r for r in rows if r.get("kind") != "eval"]
    report = write_report(
        ctx.run_dir,
        "ftis",
        cfg.nodes or cfg.model,
        cfg.task,
        report_rows,
        compare,
        ids if report_rows else None,
        reconstruction=(
            "F-TIS, arXiv 2605.22537: a reconstruction from docs/methods.md (choices stated in corp/methods/ftis.py)"
        ),
        steps=reached["ftis"],
        # every party's compute toward F-TIS's models: the sum over nodes, each at its own model's size
        # (corp bench charges a cell this; the per-node ledgers are under `nodes`)
        method_flops=sum(ledgers[("ftis", k)]["flops"] for k in range(len(names))),
        method_ledger_parties=[
            {
                "node": k,
                "model": n,
                "n_params": ledgers[("ftis", k)]["n_params"],
                "flops": ledgers[("ftis", k)]["flops"],
            }
            for k, n in enumerate(names)
        ],
        method_ledger_note=(
            "F-TIS, all nodes: each node's generation of its rollouts and the forward pass for their logprobs (2N per "
            "token) and its training on the mixed group (6N per prompt + completion token), N its own model's size; "
            "test evaluations and the GRPO comparison arm not included"
        ),
        nodes=[
            {
                "node": k,
                "model": n,
                "weights_hash": hashes[k],
                "training_ledger": ledgers.get(("ftis", k)),
                "grpo_training_ledger": ledgers.get(("grpo", k)),
                **traffic.get(k, {}),
            }
            for k, n in enumerate(names)
        ],
        accuracy_per_step=per_step,
        per_step=step_rows,
        settings={
            "tis_cap": cfg.tis_cap,
            "kl_filter": cfg.kl_filter,
            "num_generations_per_node": cfg.num_generations,
            "mixed_group": cfg.num_generations * len(names),
            "learning_rate": cfg.learning_rate,
            "epsilon": cfg.epsilon,
            "ood_task": cfg.ood_task,
            "temperature": cfg.temperature,
            **{
                k: getattr(cfg, k)
                for k in ("epsilon_high", "scale_rewards")
                if getattr(cfg, k) != GRPOConfig.__dataclass_fields__[k].default
            },
        },
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
    if report_rows:
        report["table"] = format_rows(report_rows, report["comparisons"])
    return report


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


# In the bench, node 0 (the bench's model) learns beside the other nodes (e.g. Gemma 3 270M); one step = every
# node generates prompts_per_step * num_generations completions, computes their logprobs, and trains on
# the mixed group. The cell's FLOPs are every node's (`method_flops`, each at its own model's size);
# the row is node 0's model. Node 0 alone is evaluated on test, and the GRPO comparison arm (GRPO has
# its own cells) is not run: both would only feed F-TIS's own report.
def _n_nodes(o: dict) -> int:
    nodes = o.get("nodes", option_default(FTISConfig, "nodes"))
    names = [n for n in (nodes if isinstance(nodes, (list, tuple)) else str(nodes).split(",")) if str(n).strip()]
    return len(names) or int(opt(o, FTISConfig, "n_nodes"))


def _nodes_usable(cfg, splits: dict) -> None:
    """Before compute: node 0 is the bench's model (F-TIS's row is node 0's), and every node's model
    resolves (a partner that is not installed, e.g. gemma3-270m without `make gemma`, is one line
    here instead of a failure at the first F-TIS cell)."""
    names = cfg.node_models()
    if names[0] != cfg.model:
        raise CorpError(
            f"--nodes '{cfg.nodes}' starts with '{names[0]}', but the bench's model is '{cfg.model}' and F-TIS's "
            "row is node 0's model; put the bench's model first"
        )
    for k, name in enumerate(names):
        try:
            resolve_model(name)  # converts an embedded model once; later calls only find it
        except CorpError as exc:
            raise CorpError(f"node {k} ('{name}'): {exc}") from None


METHOD = Method(
    "ftis",
    FTISConfig,
    run_ftis,
    "F-TIS (reconstruction): nodes with their own models share rollouts + logprobs; GRPO on the mixed group with "
    "truncated importance weights and a KL filter; vs on-policy GRPO per node.",
    smoke={**SMALL, "steps": 2, "prompts_per_step": 2, "num_generations": 2, "learning_rate": 1e-3},
    summary=summary,
    bench=BenchAdapter(
        ITERATIVE,
        r"node0-ftis",
        flops=("method_flops",),
        equal_data=True,
        unit="steps",
        units_done="steps",
        # a lower bound at the bench model's size: every node generates its completions on a share of support
        unit_evals=lambda o: (
            _n_nodes(o)
            * float(opt(o, FTISConfig, "prompts_per_step"))
            * float(opt(o, FTISConfig, "num_generations"))
            / max(1.0, float(opt(o, FTISConfig, "n_support")))
        ),
        defaults={"skip_grpo_baseline": True, "eval_nodes": "0", "eval_every": 1_000_000_000},
        check=_nodes_usable,
        touched=lambda o, seed, units: (
            None
            if units is None
            else drawn_positions(
                "corp-ftis", seed, units, int(o.get("n_support") or 0), int(opt(o, FTISConfig, "prompts_per_step"))
            )
        ),
    ),
)
