"""A population of low-rank specialists in one batched pass on the hf backend (no weight written).

Paper: EGGROLL, arXiv 2511.16652, whose code scores a
population of rank-r perturbations without materialising them (through vLLM multi-LoRA). Departures:
this is corp's own pass for transformers' `generate` (forward hooks and `bmm` over specialist groups,
not LoRA kernels); the embedding is perturbed too (EGGROLL perturbs linear layers only; `--exclude
embed_tokens` does that here); it serves RandOpt, CoRP and ES populations, not EGGROLL's ES alone.

Under a low-rank noise scheme (`corp.algorithms.perturb.lowrank_noise`) specialist s changes weight matrix W
(m x n) by sigma_s E_s, E_s = A_s B_s^T / sqrt(R), so a linear layer's output on a row of s is

    x (W + sigma_s E_s)^T = x W^T + (sigma_s / sqrt(R)) (x B_s) A_s^T.

`FactoredPopulation` puts forward hooks on every `nn.Linear` and `nn.Embedding` whose weight is a
selected 2-D parameter. The rows of a batch are grouped by specialist (g specialists x P prompts,
specialist-major); each hook adds its group's term with two batched matmuls over the g groups
(`bmm`: (g, P*T, n) x (g, n, R) x (g, R, m)), so the base product is shared by every row and the
perturbation costs (m + n) R multiply-adds per token. The embedding lookup adds
(sigma_s / sqrt(R)) A_s[token] B_s^T; a tied lm_head is the same parameter, so its hook adds
(sigma_s / sqrt(R)) (h B_s) A_s^T with the embedding's factors, as the materialised tied weight
does. 1-D parameters (norms, biases) have no noise under the scheme, so nothing is added there.

The factors are drawn by `corp.algorithms.perturb.lowrank_noise.factors`, the same function the dense
(reference) noise is built from, so the batched pass equals scoring each specialist alone with
materialised weights W0 + sigma E up to floating-point rounding: the perturbation is added in fp32
to the layer output instead of to the weight, and rows are padded to other widths. Tolerance stated
and tested (tests/test_lowrank_population.py): logits within 1e-4 relative on fp32, greedy answers
agree on >= 99% of prompts (all of them on the tiny test model).

Directions (CoRP's step search, `direction_generations`): a direction of seed components and merged
terms is, per matrix, sum_k c_k A_k B_k^T / sqrt(R) = A B^T with A = [A_1 | ... | A_K] (m x KR) and
B = [c_1 B_1 | ... | c_K B_K] / sqrt(R) (n x KR) (`direction_factors`, exact, one factor block per
distinct seed). A step size t scales the whole update, so the candidates base + t m of one merged
term share one factor pair: `set_shared` installs it once with a scale per row group, and the
hooks add t_g (x B) A^T with one matmul over all groups. The cost moves into generation: the
products cost K R (m + n) per token and matrix, against m n for the base product, so at large K R
generation slows (SmolLM2-135M at K R = 512: 1.5-2.2x plain generation, results/step-search/factored).
Same tolerance as for specialists (tests/test_step_factored.py). The factors of the last two
directions and of the last elite set stay cached until `release_factors`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from corp.algorithms.perturb.direction import Component, Merged
from corp.algorithms.perturb.lowrank_noise import factors, lowrank_rank
from corp.errors import CorpError
from corp.runtime.backends.base import Generations

_KEEP_TERMS = 2  # unit factors kept by direction_factors: a step search's direction and the centre or the last one


class FactoredPopulation:
    """Hooks that add each row group's low-rank perturbation (module docstring). `set_group` chooses
    the specialists of the next batches; `hooks()` installs the hooks for the length of a block."""

    def __init__(self, model: torch.nn.Module, params: Sequence[tuple[str, torch.nn.Parameter]], scheme: str):
        self.rank = lowrank_rank(scheme)
        if self.rank is None:
            raise CorpError(f"the batched low-rank pass needs a low-rank noise scheme, not '{scheme}'")
        self.model, self.scheme = model, scheme
        self.matrices = {id(p): n for n, p in params if p.dim() == 2}
        self.shapes = {n: tuple(p.shape) for n, p in params if p.dim() == 2}
        self.linears: list[tuple[torch.nn.Module, str]] = []
        self.embeddings: list[tuple[torch.nn.Module, str]] = []
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if weight is None or id(weight) not in self.matrices:
                continue
            if type(module) is torch.nn.Linear:
                self.linears.append((module, self.matrices[id(weight)]))
            elif type(module) is torch.nn.Embedding and module.max_norm is None:
                self.embeddings.append((module, self.matrices[id(weight)]))
        covered = {n for _, n in self.linears + self.embeddings}
        missing = [n for n in self.shapes if n not in covered]
        if missing:
            # a matrix used other than by nn.Linear / nn.Embedding (GPT-2's Conv1D, a fused kernel):
            # the hooks would leave it unperturbed, so this model is scored one specialist at a time
            raise CorpError(
                f"the batched low-rank pass cannot perturb '{missing[0]}' "
                "(not the weight of an nn.Linear or nn.Embedding)"
            )
        self.device = next(model.parameters()).device
        self._A: dict[str, torch.Tensor] = {}  # name -> (g, m, R)
        self._B: dict[str, torch.Tensor] = {}  # name -> (g, n, R), scaled by sigma_s / sqrt(R)
        # shared mode (`set_shared`): one (m, k) / (n, k) factor pair per matrix for every group, and
        # each group's scale, (g, 1, 1); None in population mode (`set_group`)
        self._scales: torch.Tensor | None = None
        self.group = 0
        self._terms: OrderedDict[tuple, dict[str, tuple[torch.Tensor, torch.Tensor]]] = OrderedDict()
        self._raw: tuple[tuple[int, ...], dict[str, tuple[torch.Tensor, torch.Tensor]]] | None = None

    def draw(self, seed: int, generator: torch.Generator | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """The factors of every perturbed matrix of specialist `seed` (CPU fp32): what its apply costs here."""
        gen = generator or torch.Generator(device="cpu")
        return {n: factors(seed, n, shape, self.scheme, gen) for n, shape in self.shapes.items()}

    def set_group(self, drawn: Sequence[dict[str, tuple[torch.Tensor, torch.Tensor]]], sigmas: Sequence[float]) -> None:
        """The next batches hold len(drawn) specialists, rows specialist-major, with these factors and sigmas."""
        coef = torch.tensor([float(s) / self.rank**0.5 for s in sigmas], dtype=torch.float32).view(-1, 1, 1)
        self.group, self._scales = len(drawn), None
        for n in self.shapes:
            self._A[n] = torch.stack([d[n][0] for d in drawn]).to(self.device)
            self._B[n] = torch.stack([d[n][1] for d in drawn]).mul_(coef).to(self.device)  # in place: no 2nd copy

    def set_shared(self, unit: dict[str, tuple[torch.Tensor, torch.Tensor]], scales: Sequence[float]) -> None:
        """The next batches hold len(scales) row groups of ONE update at several scales: group j adds
        scales[j] * (x B) A^T with the same (A (m x k), B (n x k)) per matrix (a direction's
        `direction_factors`), so the factors are neither copied nor stacked per group."""
        if set(unit) != set(self.shapes):
            missing = sorted(set(self.shapes) ^ set(unit))
            raise CorpError(f"factored update: factors of '{missing[0]}' missing or not a perturbed matrix")
        self.group = len(scales)
        self._scales = torch.tensor([float(x) for x in scales], dtype=torch.float32, device=self.device).view(-1, 1, 1)
        for n, (A, B) in unit.items():
            self._A[n], self._B[n] = A.to(self.device), B.to(self.device)

    def direction_factors(self, direction) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], float] | None:
        """(unit factors, scale) with update = scale * sum over matrices of A B^T, for a direction of
        seed components and merged terms under this scheme; None for anything else (a projected
        LowRankDirection: its own factors, materialised as they are).

        Under the scheme a direction sum_c coef_c sigma_c E(seed_c) is, per matrix, A B^T with
        A = [A_1 | ... | A_K] (m x KR) and B = [f_1 B_1 | ... | f_K B_K] (n x KR), f_k = (sum of
        coef * sigma over seed k's components) / sqrt(R): exact, rank <= K R. A direction that is one
        merged term scale * M gives M's factors and `scale`, so every step size of a step search
        shares one factor pair (cached: the last few terms, each drawn once)."""

        terms = list(direction.components)
        if not terms or not all(isinstance(t, (Component, Merged)) for t in terms) or not direction.prefixable:
            return None
        if len(terms) == 1 and isinstance(terms[0], Merged):
            key, scale, comps = terms[0].components, terms[0].scale, terms[0].components
        else:
            key, scale, comps = tuple(terms), 1.0, direction.seed_components()
        unit = self._terms.get(key)
        if unit is None:
            unit = self._build(comps)
            self._terms[key] = unit
            while len(self._terms) > _KEEP_TERMS:
                self._terms.popitem(last=False)
        else:
            self._terms.move_to_end(key)
        return unit, float(scale)

    def release_factors(self) -> None:
        """Free the cached factors of directions (`direction_factors`); they are drawn again when asked."""
        self._terms.clear()
        self._raw = None

    def _build(self, components) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Unit factors of sum_c coef_c sigma_c E(seed_c) (direction_factors), per perturbed matrix.
        The factors of the last set of seeds are kept unscaled: a step search's rules (m1, m2) weight
        the same elites, so the second direction only rescales B's blocks (and shares A)."""
        coefs: dict[int, float] = {}  # seed -> sum of coef * sigma: the noise depends on the seed only
        for c in components:
            coefs[c.seed] = coefs.get(c.seed, 0.0) + c.coef * c.sigma
        seeds = [(seed, f / self.rank**0.5) for seed, f in coefs.items() if f != 0.0]
        key = tuple(seed for seed, _ in seeds)
        if self._raw is None or self._raw[0] != key:
            self._raw = None  # free the last set before drawing the next
            gen = torch.Generator(device="cpu")
            raw = {}
            for n, shape in self.shapes.items():
                drawn = [factors(seed, n, shape, self.scheme, gen) for seed, _ in seeds]
                raw[n] = (
                    torch.cat([A for A, _ in drawn], 1) if drawn else torch.zeros(shape[0], 0),
                    torch.cat([B for _, B in drawn], 1) if drawn else torch.zeros(shape[1], 0),
                )
            self._raw = (key, raw)
        f = torch.tensor([x for _, x in seeds], dtype=torch.float32).repeat_interleave(self.rank)
        return {n: (A, B * f) for n, (A, B) in self._raw[1].items()}  # B's block k scaled by f_k

    def _grouped(self, t: torch.Tensor) -> torch.Tensor:
        if t.shape[0] % self.group:
            raise RuntimeError(
                f"batched low-rank pass: {t.shape[0]} rows do not split into {self.group} specialist groups"
            )
        return t.view(self.group, -1, *t.shape[2:]) if t.is_contiguous() else t.reshape(self.group, -1, *t.shape[2:])

    def _linear_hook(self, name: str):
        def hook(module, args, output):
            if self._scales is not None:
                return self._shared_linear(name, args[0], output)
            x = self._grouped(args[0]).to(torch.float32)  # (g, P*T, n)
            xb = torch.bmm(x, self._B[name])  # (g, P*T, R)
            if output.dtype == torch.float32 and output.is_contiguous():
                # added in place (baddbmm): no (g, P*T, m) temporary, which at prefill costs more than the product
                self._grouped(output).baddbmm_(xb, self._A[name].transpose(1, 2))
                return output
            delta = torch.bmm(
                xb, self._A[name].transpose(1, 2)
            )  # (g, P*T, m), fp32, then one rounding to the model's dtype
            return output + delta.reshape(output.shape).to(output.dtype)

        return hook

    def _embedding_hook(self, name: str):
        def hook(module, args, output):
            if self._scales is not None:  # shared factors: A[token] B^T, scaled per group
                A, B = self._A[name], self._B[name]
                rows = self._grouped(A[args[0]]) * self._scales  # (g, P*T, k)
                delta = torch.matmul(rows, B.t())  # (g, P*T, n)
                return output + delta.reshape(output.shape).to(output.dtype)
            ids = self._grouped(args[0])  # (g, P*T)
            A = self._A[name]
            rows = A[torch.arange(self.group, device=A.device).unsqueeze(1), ids]  # (g, P*T, R): A_s[token]
            delta = torch.bmm(rows, self._B[name].transpose(1, 2))  # (g, P*T, n)
            return output + delta.reshape(output.shape).to(output.dtype)

        return hook

    def _shared_linear(self, name: str, x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """output + scale_g (x B) A^T for the rows of group g, one factor pair for all groups."""
        A, B = self._A[name], self._B[name]  # (m, k), (n, k)
        if A.shape[1] == 0:
            return output
        xb = self._grouped(torch.matmul(x.to(torch.float32), B)) * self._scales  # (g, P*T, k)
        if output.dtype == torch.float32 and output.is_contiguous():
            out2 = output.view(-1, output.shape[-1])  # added in place: no (rows, m) temporary
            out2.addmm_(xb.reshape(-1, xb.shape[-1]), A.t())
            return output
        delta = torch.matmul(xb, A.t())  # fp32, then one rounding to the model's dtype
        return output + delta.reshape(output.shape).to(output.dtype)

    @contextmanager
    def hooks(self) -> Iterator[None]:
        handles = [m.register_forward_hook(self._linear_hook(n)) for m, n in self.linears]
        handles += [m.register_forward_hook(self._embedding_hook(n)) for m, n in self.embeddings]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            self._A.clear()
            self._B.clear()
            self._scales = None


def prompt_layout(backend, prompts: Sequence[str]) -> tuple[list[list[int]], list[int], int, int]:
    """Encoded prompts, their order (similar lengths batch together), P = prompts per `generate`
    and g = row groups per `generate` (g x P <= batch_size rows)."""
    encoded = backend.encode(prompts)
    order = sorted(range(len(prompts)), key=lambda k: len(encoded[k]))
    per_batch = max(1, min(len(prompts), backend.batch_size))
    return encoded, order, per_batch, max(1, backend.batch_size // per_batch)


def _group_generations(backend, encoded, order, per_batch, members, max_new_tokens, stop) -> dict[int, Generations]:
    """Greedy generations of every member's row group (installed in the hooks, member-major) on every
    prompt; the group's generation time is shared equally by its members."""
    texts = {i: [""] * len(encoded) for i in members}
    ids = {i: [[] for _ in encoded] for i in members}
    t0 = time.perf_counter()
    for start in range(0, len(order), per_batch):
        chunk = order[start : start + per_batch]
        rows = [encoded[k] for _ in members for k in chunk]
        # no shared prefix computed once: a batch-1 forward would not split into the hooks' row groups
        done = backend.generate_rows(rows, max_new_tokens, stop=stop, shared_prefix=False)
        for r, (row_ids, text) in enumerate(done):
            i, k = members[r // len(chunk)], chunk[r % len(chunk)]
            ids[i][k], texts[i][k] = row_ids, text
    seconds = (time.perf_counter() - t0) / len(members)
    lens = [len(e) for e in encoded]
    return {i: Generations(texts[i], lens, [len(x) for x in ids[i]], seconds, ids[i]) for i in members}


def population_generations(
    backend,
    factored: FactoredPopulation,
    specialists: Sequence[tuple[int, float]],
    prompts: Sequence[str],
    max_new_tokens: int,
    stop=None,
) -> Iterator[tuple[int, Generations, float]]:
    """Greedy generations of every specialist (seed, sigma) on every prompt, batched: groups of
    g = batch_size // P specialists x P = min(M, batch_size) prompts per `generate`, the base
    weights in place. Yields (index in `specialists`, its Generations, seconds spent drawing its
    factors) as each group finishes; a group's generation time is shared equally by its specialists."""
    backend.set_direction(None)  # the hooks perturb the base: no specialist may be applied
    encoded, order, per_batch, group = prompt_layout(backend, prompts)
    gen = torch.Generator(device="cpu")
    with factored.hooks():
        for first in range(0, len(specialists), group):
            members = list(range(first, min(first + group, len(specialists))))
            drawn, draw_s = [], []
            for i in members:
                t0 = time.perf_counter()
                drawn.append(factored.draw(specialists[i][0], gen))
                draw_s.append(time.perf_counter() - t0)
            factored.set_group(drawn, [specialists[i][1] for i in members])
            gens = _group_generations(backend, encoded, order, per_batch, members, max_new_tokens, stop)
            for i, s in zip(members, draw_s):
                yield i, gens[i], s


def direction_generations(
    backend,
    factored: FactoredPopulation,
    unit: dict[str, tuple[torch.Tensor, torch.Tensor]],
    scales: Sequence[float],
    prompts: Sequence[str],
    max_new_tokens: int,
    stop=None,
) -> Iterator[tuple[int, Generations, float]]:
    """Greedy generations of base + scale * update for every scale (one update, `unit` its factors
    from `direction_factors`: a step search's step sizes), batched as `population_generations`
    batches specialists, the base weights in place and nothing materialised. Yields (index in
    `scales`, Generations, seconds spent installing the group's factors, shared by its members)."""
    if backend.perturber.current is not None:  # the hooks perturb the base (a restore copies every weight)
        backend.set_direction(None)
    encoded, order, per_batch, group = prompt_layout(backend, prompts)
    with factored.hooks():
        for first in range(0, len(scales), group):
            members = list(range(first, min(first + group, len(scales))))
            t0 = time.perf_counter()
            factored.set_shared(unit, [scales[i] for i in members])
            install_s = (time.perf_counter() - t0) / len(members)
            gens = _group_generations(backend, encoded, order, per_batch, members, max_new_tokens, stop)
            for i in members:
                yield i, gens[i], install_s
