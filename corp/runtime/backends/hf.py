"""`hf` backend: transformers generation, batched and left-padded, greedy by default.

The reference for correctness and the default on CPU. Prompts are formatted with the tokenizer's
chat template when it has one (instruction-tuned models), else used as plain text (base models).
Batches are formed from prompts sorted by length so little compute goes to padding.

The token prefix a batch's prompts share is computed once, not once per row
(corp.runtime.backends.shared_prefix): a chat template opens every prompt with the same tokens
(SmolLM2's system message and user-turn opening, with arith's "What is ", are 27 of the quick
start's 46 prompt tokens), so left-padded rows spent 1,701 of a 64-example pass's at most 4,416
fed tokens (38%) recomputing them. Its cache is repeated to the batch and the padding goes between
it and each row's own tokens; every row keeps its unpadded positions and what it attends to, so
the answers are those of the left-padded batch (up to float rounding: the prefix is one batch-1
product instead of a row of a batched one). Models whose cache is not a plain one take the
left-padded path.

Sampling (temperature > 0) does not use transformers' sampler, which draws the whole batch's
tokens from torch's one global generator (so a row's sample would depend on its batch-mates and
on the batch order). Instead `RowSampler`, a logits processor run last under greedy decoding,
draws each row's token by inverse CDF from a uniform of that row's own CPU `torch.Generator`
(seeded with `completion_seed`, see corp.runtime.backends.base), and leaves only that token
finite, so greedy's argmax takes it. Temperature and top-p are applied as transformers applies
them. Cost: one tiny CPU draw per row and step plus one batched cumsum and search, small next to
the forward pass; the global RNG is never touched.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from corp.algorithms.perturb import SCHEME_VERSION, Direction, ParamFilter, Perturber, weights_hash
from corp.runtime.backends.base import (
    LOGPROBS,
    MODEL,
    PERTURBER,
    Backend,
    Generations,
    check_fits,
    completion_seed,
    context_of,
    cut_at_stop,
    resolve_seeds,
)
from corp.runtime.backends.shared_prefix import prefix_cache, shared_length
from corp.runtime.models import load_model
from corp.runtime.models.load import checkpoint_tensors


def format_prompt(tokenizer, prompt: str) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    # callers encode with add_special_tokens=False (a chat template writes its own BOS), so a plain
    # prompt gets the BOS its tokenizer would add here: Gemma degenerates without it
    bos = tokenizer.bos_token_id
    if bos is not None and tokenizer("a")["input_ids"][:1] == [bos] and not prompt.startswith(tokenizer.bos_token):
        return tokenizer.bos_token + prompt
    return prompt


def _mapped(model_path, device: torch.device) -> dict:
    """The checkpoint's tensors as safetensors maps them, for the Perturber's pristine copy (none off
    the cpu, for an in-memory model, or a directory without safetensors)."""
    if device.type != "cpu" or model_path is None or not any(Path(model_path).glob("*.safetensors")):
        return {}
    return checkpoint_tensors(model_path)


class RowSampler(LogitsProcessor):
    """A logits processor that samples each row from its own generator (module docstring)."""

    def __init__(self, row_seeds: list[int], temperature: float, top_p: float):
        self.gens = [torch.Generator().manual_seed(s) for s in row_seeds]
        self.temperature, self.top_p = float(temperature), float(top_p)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logits = scores.float() / self.temperature
        if self.top_p < 1.0:
            # as transformers' TopPLogitsWarper: drop the least likely tokens holding 1 - top_p of the mass, keep >= 1
            sorted_logits, sorted_idx = torch.sort(logits, descending=False, dim=-1)
            cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            drop = cum <= (1 - self.top_p)
            drop[..., -1:] = False
            logits = logits.masked_fill(drop.scatter(1, sorted_idx, drop), float("-inf"))
        cdf = logits.softmax(dim=-1).cumsum(dim=-1)
        u = torch.cat([torch.rand(1, generator=g) for g in self.gens]).to(cdf.device)
        # the first token whose cumulative probability exceeds x = u * total (so never a zero-probability
        # token); x stays below the total, which rounding of u * total could otherwise reach
        total = cdf[:, -1]
        x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total))).unsqueeze(1)
        tokens = torch.searchsorted(cdf, x, right=True)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, tokens, 0.0)


class HFBackend(Backend):
    name = "hf"
    capabilities = frozenset({PERTURBER, MODEL, LOGPROBS})

    def __init__(
        self,
        model,
        tokenizer,
        batch_size: int = 64,
        param_filter: ParamFilter | None = None,
        model_id: str | None = None,
        model_path=None,
        scheme: str = SCHEME_VERSION,
    ):
        """`model_id`/`model_path`: where the weights came from (None for an in-memory model: the
        caller names it); `scheme`: the noise scheme directions are materialised under (the run's)."""
        self.model, self.tokenizer = model, tokenizer
        self.model_id, self.model_path = model_id, model_path
        self._weights_hash: str | None = None
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.batch_size = batch_size
        self.device = next(model.parameters()).device
        self.perturber = Perturber(model, param_filter, scheme=scheme, pristine=_mapped(model_path, self.device))
        self.n_params = sum(p.numel() for p in model.parameters())
        self.context_length = context_of(model.config)
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        eos = eos if eos is not None else tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.eos_ids.add(tokenizer.eos_token_id)
        self.eos_ids.discard(None)

    @classmethod
    def from_model_name(cls, name: str | None, device: str = "cpu", dtype: str | None = None, **kwargs) -> HFBackend:

        model, tokenizer, model_id, path = load_model(name, device=device, dtype=dtype)
        return cls(model, tokenizer, model_id=model_id, model_path=path, **kwargs)

    @property
    def weights_hash(self) -> str:
        """sha256 of the base weights, computed on first use and kept (hashing reads every weight).
        Read it before changing the weights outside `set_direction` (training, ES's centre): it
        names the base the run started from."""
        if self._weights_hash is None:
            current = self.perturber.current
            if current is not None:  # hash the base, not the specialist that happens to be applied
                self.perturber.restore()
            self._weights_hash = weights_hash(self.model)
            if current is not None:
                self.perturber.apply(current)
        return self._weights_hash

    def set_direction(self, direction: Direction | None) -> None:
        self.perturber.apply(direction)

    def prefetch(self, direction: Direction | None) -> None:
        # On a GPU the host's cores are idle while the model generates, so the next specialist's draw
        # is free; on a CPU it competes with generation for the same cores (measured on 2 cores: 1.09x
        # slower per specialist, results/prefetch-noise). CORP_PREFETCH=1 forces it on, 0 off.
        wanted = os.environ.get("CORP_PREFETCH", "auto")
        if wanted == "1" or (wanted == "auto" and self.device.type != "cpu"):
            self.perturber.prefetch(direction)

    @torch.inference_mode()
    def logprobs(self, prompts, completions, temperature=1.0) -> list[list[float]]:
        if len(prompts) != len(completions):
            raise ValueError(f"logprobs: {len(prompts)} prompts but {len(completions)} completions")
        encoded = [
            self.tokenizer(format_prompt(self.tokenizer, p), add_special_tokens=False)["input_ids"] for p in prompts
        ]
        out: list[list[float]] = [[] for _ in prompts]
        order = sorted(range(len(prompts)), key=lambda k: len(encoded[k]) + len(completions[k]))
        pad = self.tokenizer.pad_token_id
        for start in range(0, len(order), self.batch_size):
            batch = [k for k in order[start : start + self.batch_size] if len(completions[k])]
            if not batch:
                continue
            seqs = [list(encoded[k]) + list(completions[k]) for k in batch]
            width = max(len(s) for s in seqs)
            input_ids = torch.full((len(seqs), width), pad, dtype=torch.long)
            attention = torch.zeros((len(seqs), width), dtype=torch.long)
            for r, s in enumerate(seqs):  # right padding: every real token keeps its position
                input_ids[r, : len(s)] = torch.tensor(s, dtype=torch.long)
                attention[r, : len(s)] = 1
            positions = (attention.cumsum(-1) - 1).clamp(min=0)
            logits = self.model(
                input_ids=input_ids.to(self.device),
                attention_mask=attention.to(self.device),
                position_ids=positions.to(self.device),
            ).logits
            logsm = torch.log_softmax(logits.float() / temperature, dim=-1)
            for r, k in enumerate(batch):
                p, c = len(encoded[k]), len(completions[k])
                # the token at position t is predicted by the logits at t - 1
                targets = input_ids[r, p : p + c].to(logsm.device)
                out[k] = logsm[r, p - 1 : p + c - 1].gather(-1, targets.unsqueeze(-1)).squeeze(-1).tolist()
        return out

    def encode(self, prompts) -> list[list[int]]:
        """Token ids of each prompt as `generate` feeds it (chat template, no added special tokens)."""
        return [
            self.tokenizer(format_prompt(self.tokenizer, p), add_special_tokens=False)["input_ids"] for p in prompts
        ]

    def prompt_lengths(self, prompts) -> list[int]:
        return [len(e) for e in self.encode(prompts)]

    def _batch(self, seqs, max_new_tokens, stop, shared_prefix):
        """(input_ids, attention mask, cache or None) for `generate`: the prefix every row shares, once
        and cached where it qualifies (corp.runtime.backends.shared_prefix), then each row's other
        tokens, left-padded; without one, the rows left-padded. Either way a row's prompt ends at the
        batch's width, the longest prompt's length."""
        width = max(len(s) for s in seqs)
        n = shared_length(seqs, stop) if shared_prefix else 0
        cache = prefix_cache(self.model, seqs[0][:n], len(seqs), width + max_new_tokens) if n else None
        n = n if cache is not None else 0
        input_ids = torch.full((len(seqs), width), self.tokenizer.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(seqs), width), dtype=torch.long)
        input_ids[:, :n] = torch.tensor(seqs[0][:n], dtype=torch.long)
        attention[:, :n] = 1
        for r, s in enumerate(seqs):  # the padding goes between the shared prefix and the row's own tokens
            start = width - (len(s) - n)
            input_ids[r, start:] = torch.tensor(s[n:], dtype=torch.long)
            attention[r, start:] = 1
        return input_ids.to(self.device), attention.to(self.device), cache

    @torch.inference_mode()
    def generate_rows(
        self,
        seqs: list[list[int]],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop=None,
        row_seeds: list[int] | None = None,
        shared_prefix: bool = True,
    ) -> list[tuple[list[int], str]]:
        """One left-padded `model.generate` over the token sequences `seqs` (one batch, in this row
        order): each row's generated ids up to and including its end-of-sequence token or stop
        string, and its text. The one generation step of `generate` and of the batched low-rank pass.
        Sampling (temperature > 0) needs `row_seeds`, one per row: each row draws from its own seed.
        The rows' shared token prefix is computed once (module docstring); `shared_prefix=False`
        computes it in every row (a caller whose forward hooks need the batch's rows in every pass)."""
        check_fits([len(s) for s in seqs], max_new_tokens, self.context_length, self.context_source)
        if temperature > 0 and (row_seeds is None or len(row_seeds) != len(seqs)):
            raise ValueError("sampled generation needs one seed per row (row_seeds)")
        pad = self.tokenizer.pad_token_id
        input_ids, attention, cache = self._batch(seqs, max_new_tokens, stop, shared_prefix)
        kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=sorted(self.eos_ids))
        if cache is not None:  # generate feeds only the tokens after the cached prefix
            kwargs["past_key_values"] = cache
        if stop:  # transformers' StopStringCriteria: a row ends when its text ends with a stop string
            kwargs.update(stop_strings=list(stop), tokenizer=self.tokenizer)
        # greedy decoding; when sampling, RowSampler (run last) leaves one finite token per row
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if temperature > 0:
            kwargs["logits_processor"] = LogitsProcessorList([RowSampler(list(row_seeds), temperature, top_p)])
        out = self.model.generate(input_ids=input_ids, attention_mask=attention, **kwargs)
        width = input_ids.shape[1]
        rows = []
        for ids in out[:, width:].tolist():
            cut = len(ids)
            for pos, tok in enumerate(ids):
                if tok in self.eos_ids:
                    cut = pos + 1
                    break
            rows.append(cut_at_stop(self.tokenizer, ids[:cut], stop))  # also drops the padding after a stop
        return rows

    @torch.inference_mode()
    def generate(
        self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, n=1, seed=None, stop=None, seeds=None
    ) -> Generations:
        t0 = time.perf_counter()
        encoded = self.encode(prompts)
        jobs = [(i, j) for i in range(len(prompts)) for j in range(n)]
        order = sorted(range(len(jobs)), key=lambda k: len(encoded[jobs[k][0]]))
        out_texts: list[str] = [""] * len(jobs)
        out_ids: list[list[int]] = [[] for _ in jobs]
        gen_counts = [0] * len(jobs)
        sampled = temperature > 0
        row_seed = None
        if sampled:
            pseeds = resolve_seeds(len(prompts), seed, seeds)
            row_seed = [completion_seed(pseeds[i], j) for i, j in jobs]
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            done = self.generate_rows(
                [encoded[jobs[k][0]] for k in batch],
                max_new_tokens,
                temperature,
                top_p,
                stop,
                row_seeds=[row_seed[k] for k in batch] if sampled else None,
            )
            for k, (ids, text) in zip(batch, done):
                gen_counts[k] = len(ids)
                out_ids[k] = ids
                out_texts[k] = text
        prompt_counts = [len(encoded[i]) for i, _ in jobs]
        return Generations(out_texts, prompt_counts, gen_counts, time.perf_counter() - t0, out_ids)
