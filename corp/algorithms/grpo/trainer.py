"""GRPO trainer core: sample G completions per prompt, group advantages, clipped per-token loss.

Paper: Shao et al., "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language
Models" (arXiv 2402.03300). Reference implementation: TRL's `GRPOTrainer` (trl 1.16,
`GRPOTrainer._compute_loss`); our per-token loss and the three aggregations `grpo`, `dapo` and
`dr_grpo` equal TRL's on identical inputs (tests/test_grpo.py calls TRL's own `_compute_loss`).

What one optimizer step does (TRL's defaults: num_iterations = 1, steps_per_generation =
gradient_accumulation_steps):
1. draw `prompts_per_step` prompts from the support split (a fixed function of seed and step, so a
   resumed run draws the same ones) and sample G completions each with the hf backend;
2. rewards -> advantages per group: (R - mean) / (std + 1e-4) (std with Bessel's correction, as TRL),
   or R - mean (`--scale-rewards none`, Dr. GRPO);
3. split the G * prompts sequences into `grad_accum` micro-batches; per token,
   rho = exp(logp - logp_old), loss = -min(rho A, clip(rho, 1 - eps, 1 + eps_high) A) + beta KL_k3,
   aggregated as `--loss-type` says; backward; one AdamW step (weight decay 0, grad-norm clip 1.0,
   as the HF Trainer defaults).
With `--num-iterations 1` logp_old is logp detached (TRL skips its computation), so rho = 1 and
the clip is inactive; with mu > 1 the batch is reused mu times against logp_old computed once.

Loss variants (`--loss`) are small registered classes, one file each (interface and registry:
corp/algorithms/grpo/base.py): per-response and per-token weights (detached, >= 0) on the clipped
per-token loss; the ratio and the clip are GRPO's for every variant.

Where we depart from TRL, and why:
- Log-probabilities are taken from logits / temperature, as TRL does; generation uses the hf
  backend (transformers `generate`, top_k = 0, top_p = 1), not TRL's generation loop.
- One process, no accelerate / DeepSpeed; no vLLM generation (CPU first).
- Trained tokens in the ledger are prompt + completion tokens of every sequence in a training
  forward/backward (6 N per token, also for LoRA, where the true backward is cheaper, about
  4 N + 6 N_trainable: a conservative charge against LoRA, corp.runtime.ledger; stated in the report). The generation and any logp_old / reference forward passes count as inference.
"""

from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from corp.algorithms.grpo.base import get_loss
from corp.config import RunConfig, flag
from corp.errors import CorpError
from corp.evaluate.rewards import compute_rewards
from corp.extras import require
from corp.runtime.backends.base import MODEL
from corp.runtime.backends.host import hf_state
from corp.runtime.ledger import Ledger
from corp.runtime.loop import Steps, run_steps
from corp.runtime.runs import atomic_write_with

AGGREGATIONS = ("grpo", "dapo", "dr_grpo")


@dataclass
class GRPOConfig(RunConfig):
    loss: str = "grpo"
    """Loss variant, a registered name (corp/algorithms/grpo/): grpo (plain), cov (covariance-weighted), reco (coverage reweighting)."""
    loss_type: str = "dapo"
    """Aggregation, as TRL's loss_type: grpo (per-sequence mean), dapo (token mean, TRL's default), dr_grpo (batch x max length)."""
    steps: int = 10
    """Optimizer steps."""
    prompts_per_step: int = 4
    """Distinct prompts per step (each gets --num-generations completions). TRL counts completions instead: its per_device_train_batch_size x gradient_accumulation_steps is this x --num-generations."""
    num_generations: int = 8
    """G: completions per prompt."""
    temperature: float = 1.0
    """Sampling temperature (logprobs use logits / temperature, as TRL)."""
    learning_rate: float = 1e-6
    """AdamW learning rate."""
    epsilon: float = 0.2
    """Clip range below 1 (and above, unless --epsilon-high is set)."""
    epsilon_high: float | None = None
    """Clip range above 1 (default: --epsilon)."""
    beta: float = 0.0
    """Weight of the k3 KL penalty to the reference (initial) model; 0 loads no reference."""
    scale_rewards: str = "group"
    """As TRL: group (divide advantages by the group std, GRPO) or none (mean-only, Dr. GRPO)."""
    num_iterations: int = 1
    """mu: optimizer steps per generated batch (TRL's num_iterations)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (gradient accumulation)."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip (0 disables)."""
    lora_r: int = 0
    """LoRA rank; 0 trains all parameters."""
    lora_alpha: int = 32
    """LoRA alpha."""
    lora_targets: str = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    """Comma-separated module names LoRA adapts."""
    checkpoint_every: int = 5
    """Save a resumable checkpoint every this many steps (and at the end)."""
    skip_test_eval: bool = False
    """Do not evaluate greedy accuracy on the test split before and after training."""

    # TRL's GRPOConfig names (max_steps, save_steps, gradient_accumulation_steps; lora_target_modules as TRL's ModelConfig)
    options: ClassVar[dict[str, str]] = {
        "steps": "max_steps",
        "checkpoint_every": "save_steps",
        "grad_accum": "gradient_accumulation_steps",
        "lora_targets": "lora_target_modules",
    }

    def validate(self) -> GRPOConfig:
        super().validate()
        get_loss(self.loss)  # an unknown name is refused here, listing the registered ones
        if self.scale_rewards not in ("group", "none"):
            raise CorpError(f"--scale-rewards '{self.scale_rewards}' is unknown; choose group or none")
        if self.loss_type not in AGGREGATIONS:
            raise CorpError(f"--loss-type '{self.loss_type}' is unknown; choose one of {', '.join(AGGREGATIONS)}")
        for name in ("steps", "prompts_per_step", "num_iterations", "grad_accum", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise CorpError(f"{flag(name, self)} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.temperature < math.inf:
            raise CorpError(f"--temperature must be > 0 and finite (GRPO samples), got {self.temperature}")
        if not 0 < self.learning_rate < math.inf:
            raise CorpError(f"--learning-rate must be > 0 and finite, got {self.learning_rate}")
        if self.epsilon < 0 or (self.epsilon_high is not None and self.epsilon_high < 0):
            raise CorpError("--epsilon and --epsilon-high must be >= 0")
        if self.beta < 0:
            raise CorpError(f"--beta must be >= 0, got {self.beta}")
        if self.lora_r < 0:
            raise CorpError(f"--lora-r must be >= 0, got {self.lora_r}")
        self.check_group()
        return self

    def check_group(self) -> None:
        """The group-size and micro-batch checks: a variant whose group is built otherwise (F-TIS's mixed
        group of K x G) states its own."""
        if self.num_generations < 2:
            raise CorpError(
                f"--num-generations must be >= 2 (advantages are relative within a group), got {self.num_generations}"
            )
        if (self.prompts_per_step * self.num_generations) % self.grad_accum:
            raise CorpError(
                f"--gradient-accumulation-steps {self.grad_accum} must divide --prompts-per-step x --num-generations = "
                f"{self.prompts_per_step * self.num_generations}"
            )


# ---------------------------------------------------------------- the math (no model needed)


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True) -> torch.Tensor:
    """(R - group mean) [/ (group std + 1e-4)], std with Bessel's correction, as TRL (scale_rewards='group'/'none')."""
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    adv = grouped - mean
    if scale:
        adv = adv / (grouped.std(dim=1, keepdim=True, unbiased=True) + 1e-4)
    return adv.reshape(-1)


def k3_kl(ref_logps: torch.Tensor, logps: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1."""
    return torch.exp(ref_logps - logps) - (ref_logps - logps) - 1


def per_token_loss(
    logps, old_logps, advantages, mask, eps_low, eps_high, beta=0.0, ref_logps=None, variant=None, response_weights=None
):
    """Clipped surrogate per token (B, T), before masking and aggregation.

    `variant` (a registered LossVariant) supplies per-token weights w (B, T); `response_weights`
    (B,) are omega. The policy-gradient term becomes omega_i w_t L_t; both weights are detached and
    the KL term is not reweighted.
    """
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    coef_1 = torch.exp(logps - old_logps)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    loss = -torch.min(coef_1 * adv, coef_2 * adv)
    if variant is not None:
        token_w = variant.token_weights(logps.detach(), adv.expand_as(logps).detach(), mask)
        if token_w is not None:
            loss = loss * token_w.detach()
    if response_weights is not None:
        loss = loss * response_weights.detach().unsqueeze(1)
    if beta != 0.0:
        loss = loss + beta * k3_kl(ref_logps, logps)
    return loss


def aggregate(
    loss_tok: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    grad_accum: int,
    max_completion_length: int,
    tokens_in_step: float,
) -> torch.Tensor:
    """TRL's aggregations for one micro-batch, already scaled for gradient accumulation.

    grpo: mean over sequences of the per-sequence token mean, / grad_accum; dr_grpo: token sum /
    (micro-batch size x max_completion_length), / grad_accum; dapo: token sum / tokens in the whole
    generation batch of the step (TRL's num_items_in_batch with steps_per_generation = grad_accum).
    """
    mask = mask.to(loss_tok.dtype)
    if loss_type == "grpo":
        return ((loss_tok * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / grad_accum
    if loss_type == "dr_grpo":
        return (loss_tok * mask).sum() / (loss_tok.size(0) * max_completion_length) / grad_accum
    if loss_type == "dapo":
        return (loss_tok * mask).sum() / max(float(tokens_in_step), 1.0)
    raise CorpError(f"unknown loss type '{loss_type}'")


def token_logps_and_entropy(
    model, input_ids, attention_mask, n_completion: int, temperature: float, with_entropy: bool = True
):
    """Per-token log-probabilities of the last n_completion tokens (logits / temperature), and entropies."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -n_completion - 1 : -1, :].float()
    logits = logits / temperature
    logsm = torch.log_softmax(logits, dim=-1)
    logps = logsm.gather(-1, input_ids[:, -n_completion:].unsqueeze(-1)).squeeze(-1)
    ent = None
    if with_entropy:
        with torch.no_grad():
            ent = -(logsm.exp() * logsm).sum(-1)
    return logps, ent


# ---------------------------------------------------------------- batches


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, P + T): left-padded prompt, right-padded completion
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor  # (B, T)
    advantages: torch.Tensor  # (B,)
    group: torch.Tensor  # (B,) prompt index
    prompt_lens: list[int]
    completion_lens: list[int]

    def rows(self, idx: slice) -> Batch:
        return Batch(
            self.input_ids[idx],
            self.attention_mask[idx],
            self.completion_mask[idx],
            self.advantages[idx],
            self.group[idx],
            self.prompt_lens[idx],
            self.completion_lens[idx],
        )


def build_batch(tokenizer, prompt_ids: list[list[int]], completion_ids: list[list[int]], advantages, group) -> Batch:
    pad = tokenizer.pad_token_id
    B = len(prompt_ids)
    P = max(len(p) for p in prompt_ids)
    T = max(1, max(len(c) for c in completion_ids))
    ids = torch.full((B, P + T), pad, dtype=torch.long)
    att = torch.zeros((B, P + T), dtype=torch.long)
    cmask = torch.zeros((B, T), dtype=torch.long)
    for r, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        ids[r, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        att[r, P - len(p) : P] = 1
        if c:
            ids[r, P : P + len(c)] = torch.tensor(c, dtype=torch.long)
            att[r, P : P + len(c)] = 1
            cmask[r, : len(c)] = 1
    return Batch(ids, att, cmask, advantages, group, [len(p) for p in prompt_ids], [len(c) for c in completion_ids])


# ---------------------------------------------------------------- the trainer


@torch.no_grad()
def lora_merged_state(policy) -> dict:
    """A peft model's weights with every LoRA layer merged, W + delta, as new tensors under the base
    model's Hugging Face names; the model is not changed."""

    base = policy.get_base_model()
    state = hf_state(base)
    for name, module in base.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            weight = module.base_layer.weight
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters)
            state[f"{name}.weight"] = weight + delta.to(weight.dtype)
    return state


class GRPOTrainer:
    """Owns the policy (the backend's model, trained in place), optimizer, ledger and checkpoints.

    Variants reuse it (FGRPO's clients as they are; F-TIS's nodes subclass it): the optimizer set-up,
    the checkpoint (`extra_state` / `load_extra_state` add a subclass's own entries) and one
    optimizer step over micro-batches (`micro_batch_step`, with the per-token loss passed in)."""

    purpose = "corp grpo (it trains the model in process)"  # named in the error when the backend holds no model

    def __init__(self, ctx, cfg: GRPOConfig):
        from corp.runtime.backends.hf import format_prompt

        self.ctx, self.cfg = ctx, cfg
        backend = ctx.backend
        backend.require(MODEL, self.purpose)
        self.backend, self.tokenizer = backend, backend.tokenizer
        self.format_prompt = format_prompt
        self.variant = get_loss(cfg.loss)
        self.max_new_tokens = ctx.max_new_tokens
        model = backend.model
        for p in model.parameters():
            p.data = p.data.float() if p.dtype != torch.float32 else p.data  # fp32 master weights for training
        self.ref_model = None
        if cfg.lora_r > 0:
            peft = require("peft", "--lora-r")
            LoraConfig, get_peft_model = peft.LoraConfig, peft.get_peft_model
            targets = [t.strip() for t in cfg.lora_targets.split(",") if t.strip()]
            names = {n.split(".")[-1] for n, _ in model.named_modules()}
            missing = [t for t in targets if t not in names]
            if missing:
                raise CorpError(f"--lora-target-modules: the model has no module named {missing[0]}")
            # LoRA's A is drawn at random; torch's default seed differs in every process, so unseeded the
            # same command trained from other adapters each time (B = 0: the first loss agrees, the
            # gradients do not). Seeded from --seed, a run reproduces, resumed or not.
            torch.manual_seed(cfg.seed)
            self.policy = get_peft_model(
                model,
                LoraConfig(
                    r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules=targets, lora_dropout=0.0, bias="none"
                ),
            )
        else:
            self.policy = model
            if cfg.beta != 0.0:
                self.ref_model = copy.deepcopy(model).eval()
                for p in self.ref_model.parameters():
                    p.requires_grad_(False)
        self.trainable = [(n, p) for n, p in self.policy.named_parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW([p for _, p in self.trainable], lr=cfg.learning_rate, weight_decay=0.0)
        self.ledger = Ledger(backend.n_params)
        self.step = 0
        self.ckpt_path = ctx.run_dir / "checkpoint.pt"
        self._synced_step = 0  # the step whose weights the engine generates with (sync_engine)

    # -- checkpoints: trainable tensors + optimizer + step + ledger (+ extra_state), one file written atomically
    checkpoint_mismatch = "was made with other trainable parameters (LoRA vs full?); use another --output-dir"

    def extra_state(self) -> dict:
        """A subclass's own entries of the checkpoint."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        """Restore what `extra_state` saved."""

    def save_checkpoint(self) -> None:
        state = {
            "step": self.step,
            "trainable": {n: p.detach().clone() for n, p in self.trainable},
            "optimizer": self.optimizer.state_dict(),
            "ledger": self.ledger.to_dict(),
            **self.extra_state(),
        }
        atomic_write_with(self.ckpt_path, lambda f: torch.save(state, f))

    def maybe_resume(self) -> None:
        if self.ckpt_path.exists():
            self.load_checkpoint()

    def load_checkpoint(self) -> None:
        try:
            state = torch.load(self.ckpt_path, map_location="cpu", weights_only=False)
        except Exception as exc:
            raise CorpError(
                f"checkpoint '{self.ckpt_path}' cannot be read ({type(exc).__name__}); move it away to start over"
            ) from None
        names = {n for n, _ in self.trainable}
        if set(state["trainable"]) != names:
            raise CorpError(f"checkpoint '{self.ckpt_path}' {self.checkpoint_mismatch}")
        with torch.no_grad():
            for n, p in self.trainable:
                p.copy_(state["trainable"][n])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        led = state["ledger"]
        self.ledger = Ledger(self.ledger.n_params, led["prompt_tokens"], led["generated_tokens"], led["trained_tokens"])
        self.load_extra_state(state)

    def sync_engine(self, force: bool = False) -> None:
        """Where the engine keeps weights of its own (vLLM), it generates with the policy's weights as
        they are now, pushed before the first generation after each optimizer step (TRL's vLLM
        colocate mode). LoRA is merged for the push into new tensors, W + delta, as merge_and_unload
        computes them; TRL merges into the model and unmerges after, which leaves W - delta + delta,
        not W. The hf engine generates with the policy itself."""
        if self.backend.shares_weights or (self._synced_step == self.step and not force):
            return
        self.backend.push_weights(lora_merged_state(self.policy) if self.cfg.lora_r > 0 else None)
        self._synced_step = self.step

    # -- one step
    def sample(self) -> tuple[Batch, dict]:
        cfg, ctx = self.cfg, self.ctx
        self.sync_engine()
        support = ctx.splits["support"]
        rng = random.Random(f"corp-grpo|{cfg.seed}|{self.step}")
        examples = rng.sample(support, min(cfg.prompts_per_step, len(support)))
        self.policy.eval()
        gens = self.backend.generate(
            [e.prompt for e in examples],
            self.max_new_tokens,
            temperature=cfg.temperature,
            n=cfg.num_generations,
            seed=cfg.seed * 1_000_003 + self.step,
            stop=ctx.task.stop or None,
        )  # cut training completions as evaluation cuts them
        self.ledger.add_generation(sum(gens.prompt_tokens), sum(gens.generated_tokens))
        exs = [e for e in examples for _ in range(cfg.num_generations)]
        rewards, errors = compute_rewards(ctx.task, gens.texts, exs, ctx.reward_fn)
        r = torch.tensor(rewards, dtype=torch.float32)
        adv = group_advantages(r, cfg.num_generations, cfg.scale_rewards == "group")
        prompt_ids = [
            self.tokenizer(self.format_prompt(self.tokenizer, e.prompt), add_special_tokens=False)["input_ids"]
            for e in exs
        ]
        group = torch.arange(len(examples)).repeat_interleave(cfg.num_generations)
        batch = build_batch(self.tokenizer, prompt_ids, gens.token_ids, adv, group)
        info = {
            "reward": float(r.mean()),
            "reward_std": float(r.std()) if len(r) > 1 else 0.0,
            "reward_errors": errors,
            "completion_len": sum(gens.generated_tokens) / len(exs),
        }
        return batch, info

    def _forward_inference(self, model, batch: Batch) -> torch.Tensor:
        with torch.no_grad():
            logps, _ = token_logps_and_entropy(
                model,
                batch.input_ids,
                batch.attention_mask,
                batch.completion_mask.size(1),
                self.cfg.temperature,
                with_entropy=False,
            )
        self.ledger.add_generation(sum(batch.prompt_lens) + sum(batch.completion_lens), 0)
        return logps

    def train_step(self) -> dict:
        cfg = self.cfg
        t0 = time.perf_counter()
        batch, info = self.sample()
        old_logps = self._forward_inference(self.policy, batch) if cfg.num_iterations > 1 else None
        ref_logps = None
        if cfg.beta != 0.0:
            if self.ref_model is not None:
                ref_logps = self._forward_inference(self.ref_model, batch)
            else:
                with self.policy.disable_adapter():
                    ref_logps = self._forward_inference(self.policy, batch)
        resp_logps = old_logps
        if resp_logps is None and self.variant.needs_response_logps:
            resp_logps = self._forward_inference(self.policy, batch)
        resp_w = self.variant.response_weights(batch, resp_logps, cfg.num_generations)
        tokens_in_step = float(batch.completion_mask.sum())
        eps_high = cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high
        stats = {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_ratio": 0.0, "grad_norm": 0.0}
        extra: dict[str, float] = {}
        sums: dict[str, float] = {}

        def token_loss(
            sl: slice, mb: Batch, logps: torch.Tensor, ent: torch.Tensor, mask: torch.Tensor
        ) -> torch.Tensor:
            old = logps.detach() if old_logps is None else old_logps[sl]
            ref = None if ref_logps is None else ref_logps[sl]
            rw = None if resp_w is None else resp_w[sl]
            loss_tok = per_token_loss(
                logps, old, mb.advantages, mask, cfg.epsilon, eps_high, cfg.beta, ref, self.variant, rw
            )
            with torch.no_grad():
                sums["ent"] += float((ent * mask).sum())
                if ref is not None:
                    sums["kl"] += float((k3_kl(ref, logps) * mask).sum())
                ratio = torch.exp(logps - old)
                sums["clip"] += float((((ratio < 1 - cfg.epsilon) | (ratio > 1 + eps_high)).float() * mask).sum())
            for key, val in self.variant.last_stats.items():
                extra[key] = extra.get(key, 0.0) + val / cfg.grad_accum
            return loss_tok

        for _ in range(cfg.num_iterations):
            sums.update(ent=0.0, kl=0.0, clip=0.0)
            losses, grad_norm = self.micro_batch_step(batch, token_loss)
            for loss in losses:
                stats["loss"] += loss
            if cfg.max_grad_norm > 0:
                stats["grad_norm"] = grad_norm
        ent_sum, kl_sum, clip_sum = sums["ent"], sums["kl"], sums["clip"]
        n_tok = max(tokens_in_step, 1.0)
        stats.update(entropy=ent_sum / n_tok, kl=kl_sum / n_tok, clip_ratio=clip_sum / n_tok)
        stats["loss"] /= cfg.num_iterations
        self.step += 1
        return {
            "step": self.step,
            **info,
            **stats,
            **extra,
            "seconds": time.perf_counter() - t0,
            **{f"ledger_{k}": v for k, v in self.ledger.to_dict().items()},
        }

    def micro_batch_step(self, batch: Batch, token_loss, with_entropy: bool = True) -> tuple[list[float], float]:
        """One optimizer step on `batch`: zero the gradients; per micro-batch (--gradient-accumulation-steps of them; the
        last one shorter when they do not divide the batch), the forward pass, the per-token loss
        `token_loss(rows, micro_batch, logps, entropy, mask)` (B, T), TRL's aggregation, backward and the
        trained tokens; the gradient-norm clip; AdamW. Returns each micro-batch's loss and the grad norm
        (0 when --max-grad-norm is 0)."""
        cfg = self.cfg
        B, T = batch.input_ids.size(0), batch.completion_mask.size(1)
        micro = max(1, B // cfg.grad_accum)
        n_micro = math.ceil(B / micro)
        tokens_in_step = float(batch.completion_mask.sum())
        self.policy.train()
        self.optimizer.zero_grad(set_to_none=True)
        losses = []
        for s in range(0, B, micro):
            sl = slice(s, s + micro)
            mb = batch.rows(sl)
            logps, ent = token_logps_and_entropy(
                self.policy, mb.input_ids, mb.attention_mask, T, cfg.temperature, with_entropy
            )
            mask = mb.completion_mask.float()
            loss_tok = token_loss(sl, mb, logps, ent, mask)
            loss = aggregate(loss_tok, mask, cfg.loss_type, n_micro, self.max_new_tokens, tokens_in_step)
            loss.backward()
            self.ledger.trained_tokens += sum(mb.prompt_lens) + sum(mb.completion_lens)
            losses.append(float(loss.detach()))
        grad_norm = 0.0
        if cfg.max_grad_norm > 0:
            grad_norm = float(torch.nn.utils.clip_grad_norm_([p for _, p in self.trainable], cfg.max_grad_norm))
        self.optimizer.step()
        return losses, grad_norm

    def train(self) -> list[dict]:
        """Train to cfg.steps from the checkpoint, if any, through the shared loop; the metrics rows."""
        rows = run_steps(self.ctx, _TrainerSteps(self))
        self.policy.eval()
        return rows

    def merged_model(self):
        """The trained model as a plain transformers model (LoRA merged into the weights)."""
        if self.cfg.lora_r > 0:
            adapter_dir = self.ctx.run_dir / "adapter"
            self.policy.save_pretrained(adapter_dir)
            return self.policy.merge_and_unload()
        return self.policy


class _TrainerSteps(Steps):
    """The trainer's loop for the shared driver: a step is one optimizer step; the state is the
    checkpoint (trainable weights, optimizer, ledger), saved every --save-steps steps."""

    unit = key = "step"
    finite = ("loss", "entropy")
    finite_hint = "lower --learning-rate"

    def __init__(self, trainer: GRPOTrainer):
        self.trainer = trainer
        self.desc = f"grpo[{trainer.cfg.loss}]"
        self.metrics_path = trainer.ctx.run_dir / "metrics.jsonl"
        self.total = trainer.cfg.steps
        self.checkpoint_every = trainer.cfg.checkpoint_every

    def resume(self) -> int:
        self.trainer.maybe_resume()
        return self.trainer.step

    def step(self, t: int) -> dict:
        return self.trainer.train_step()

    def save(self) -> None:
        self.trainer.save_checkpoint()

    def postfix(self, row: dict) -> dict:
        return {"reward": f"{row['reward']:.3f}", "kl": f"{row['kl']:.4f}", "entropy": f"{row['entropy']:.3f}"}


def drawn_positions(prefix: str, seed: int, steps: int, n: int, k: int) -> int:
    """Distinct support positions drawn by `steps` steps of GRPO-style sampling:
    random.Random(f"{prefix}|{seed}|{step}").sample(support, min(k, n)) at steps 0..steps-1 (GRPO's
    `corp-grpo` in GRPOTrainer, F-TIS's `corp-ftis`); random.sample picks positions by the list's
    length alone. The bench counts the labelled examples a run touched with it."""
    seen: set[int] = set()
    for step in range(steps):
        seen.update(random.Random(f"{prefix}|{seed}|{step}").sample(range(n), min(k, n)))
    return len(seen)
