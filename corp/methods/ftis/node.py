"""F-TIS's math (truncated importance weights, the KL filter, the per-token loss), the rollouts nodes
exchange, and a node: a GRPO trainer that learns from its own and the other nodes' rollouts."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from corp.algorithms.grpo.trainer import (
    GRPOTrainer,
    build_batch,
    group_advantages,
    per_token_loss,
    token_logps_and_entropy,
)
from corp.errors import CorpError
from corp.methods.ftis.config import FTISConfig

LOGRATIO_CLAMP = 50.0
ID_BYTES, LOGPROB_BYTES, SEQ_LOGPROB_BYTES = 4, 4, 4  # int32 token ids, float32 logprobs


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

    GRPO's clipped per-token loss (corp.algorithms.grpo.trainer.per_token_loss, no KL term) times the
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
