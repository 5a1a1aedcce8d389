"""Directions in weight space and applying them to a model exactly.

A Direction is a list of (seed, sigma, coef) components; applied to base weights W0 it gives
W = W0 + sum_c coef_c * sigma_c * eps(seed_c) for every parameter the filter selects, accumulated
in fp32 and cast to the parameter's dtype once. A `Merged` term, scale * M with
M = sum_c coef_c sigma_c eps(seed_c), is materialised as M first (fp32, components in order) and
scaled once, so a step search can build M once and try many scales, and a recipe that names the
term rebuilds the same bits (`Perturber` keeps the M of the merged terms it applied last).
`Perturber` keeps a pristine copy of the selected base tensors, so every apply starts from W0 (no
drift across specialists) and `restore` is a copy, bit-exact, never a subtraction.
Per-tensor work runs on parallel workers (`corp.algorithms.perturb.workers`); the bits do not
depend on them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import ClassVar

import torch

from corp.algorithms.perturb.lowrank_noise import check_shapes, lowrank_rank, merged_noise
from corp.algorithms.perturb.noise import SCHEME_VERSION, check_scheme, noise
from corp.algorithms.perturb.pristine import pristine_base
from corp.algorithms.perturb.workers import Scratch, ScratchPool, per_tensor
from corp.errors import CorpError


@dataclass(frozen=True)
class Component:
    seed: int
    sigma: float
    coef: float = 1.0


@dataclass(frozen=True)
class Merged:
    """scale * M, M = sum_c coef_c sigma_c eps(seed_c) built first in fp32 (components in order,
    starting from zeros), then multiplied by `scale` (one rounding) and added (one rounding). The
    arithmetic differs from adding the components scaled one by one, so it is its own term kind
    (and its own JSON entry, `{"scale": s, "merged": [...]}`)."""

    scale: float
    components: tuple[Component, ...]


def materialise(
    components: Iterable[Component],
    name: str,
    shape,
    generator: torch.Generator | None = None,
    buffer: torch.Tensor | None = None,
    scheme: str = SCHEME_VERSION,
) -> torch.Tensor:
    """M = sum_c coef_c sigma_c eps(seed_c)[name] as a new fp32 CPU tensor: the one definition of a
    merged term's M, used both where M is kept (Perturber) and where it is rebuilt (add_to)."""
    gen = generator or torch.Generator(device="cpu")
    if lowrank_rank(scheme) is not None:  # same bits, built block by block from the factors
        terms = [(c.seed, [(0, c.coef * c.sigma)]) for c in components if c.coef != 0.0]
        return merged_noise(terms, 1, name, shape, scheme, gen)[0]
    M = torch.zeros(tuple(shape), dtype=torch.float32)
    for c in components:
        if c.coef == 0.0:
            continue
        buf = buffer[: M.numel()].view(M.shape) if buffer is not None else None
        M.add_(noise(c.seed, name, M.shape, gen, out=buf, scheme=scheme).mul_(c.coef * c.sigma))
    return M


def add_scaled(target: torch.Tensor, M: torch.Tensor, scale: float, buffer: torch.Tensor | None = None) -> torch.Tensor:
    """target += round(scale * M): two explicit roundings (never a fused multiply-add, whose bits
    could depend on the kernel), leaving M untouched."""
    tmp = buffer[: M.numel()].view(M.shape) if buffer is not None else torch.empty_like(M)
    return target.add_(torch.mul(M, scale, out=tmp))


@dataclass
class Direction:
    components: list[Component | Merged] = field(default_factory=list)
    prefixable: ClassVar[bool] = (
        True  # materialised as its components in order (Perturber.cache_prefix may reuse a prefix)
    )

    @classmethod
    def single(cls, seed: int, sigma: float, coef: float = 1.0) -> Direction:
        return cls([Component(int(seed), float(sigma), float(coef))])

    def is_zero(self) -> bool:
        """True when applying it leaves W0 unchanged (no components)."""
        return not self.components

    @classmethod
    def merged(cls, components: Iterable[Component], scale: float = 1.0) -> Direction:
        """One merged term scale * sum(components); `scaled` changes only its scale, so every step
        size shares one M."""
        return cls([Merged(float(scale), tuple(components))])

    def scaled(self, alpha: float) -> Direction:
        return Direction(
            [
                Merged(t.scale * alpha, t.components)
                if isinstance(t, Merged)
                else Component(t.seed, t.sigma, t.coef * alpha)
                for t in self.components
            ]
        )

    def seed_components(self) -> list[Component]:
        """The same update as plain components (a merged term's scale folded into each coef), for
        linear algebra and reports; applying these may differ from the direction in the last bits."""
        out = []
        for t in self.components:
            out += (
                [Component(c.seed, c.sigma, c.coef * t.scale) for c in t.components] if isinstance(t, Merged) else [t]
            )
        return out

    def __add__(self, other: Direction) -> Direction:
        return Direction(self.components + other.components)

    def to_json(self) -> list[dict]:
        return [
            {"scale": t.scale, "merged": [asdict(c) for c in t.components]} if isinstance(t, Merged) else asdict(t)
            for t in self.components
        ]

    @classmethod
    def from_json(cls, rows: Iterable[dict]) -> Direction:
        def component(r: dict) -> Component:
            return Component(int(r["seed"]), float(r["sigma"]), float(r.get("coef", 1.0)))

        terms: list[Component | Merged] = []
        for r in rows:
            try:
                terms.append(
                    Merged(float(r["scale"]), tuple(component(c) for c in r["merged"]))
                    if "merged" in r
                    else component(r)
                )
            except (KeyError, TypeError, ValueError):
                raise CorpError(
                    f"direction entry {str(r)[:80]} is neither a component (seed, sigma, coef) nor a merged term "
                    "(scale, merged); was it written by a newer corp?"
                ) from None
        return cls(terms)

    def add_to(
        self,
        target: torch.Tensor,
        name: str,
        generator: torch.Generator | None = None,
        buffer: torch.Tensor | None = None,
        scheme: str = SCHEME_VERSION,
        merged_m: Callable | None = None,
    ) -> torch.Tensor:
        """target += sum_c coef_c sigma_c eps(seed_c)[name], in place, component by component.

        `target` is an fp32 CPU tensor (usually a copy of the base tensor). This is the one place
        where a direction is materialised, so every backend gets the same bits: each component's
        noise is scaled first (one rounding), then added (one rounding), in component order.
        `merged_m(term, name, shape, generator, buffer)`: where a merged term's M comes from when it is
        kept (Perturber's memory, a vLLM worker's files); it must return `materialise`'s bits.
        """
        gen = generator or torch.Generator(device="cpu")
        for c in self.components:
            if isinstance(c, Merged):
                m = (
                    merged_m(c, name, target.shape, gen, buffer)
                    if merged_m is not None
                    else materialise(c.components, name, target.shape, gen, buffer, scheme)
                )
                add_scaled(target, m, c.scale, buffer)
                continue
            if c.coef == 0.0:
                continue
            buf = buffer[: target.numel()].view(target.shape) if buffer is not None else None
            eps = noise(c.seed, name, target.shape, gen, out=buf, scheme=scheme)
            target.add_(eps.mul_(c.coef * c.sigma))
        return target

    def delta(
        self,
        name: str,
        shape,
        generator: torch.Generator | None = None,
        buffer: torch.Tensor | None = None,
        scheme: str = SCHEME_VERSION,
    ) -> torch.Tensor:
        """sum_c coef_c sigma_c eps(seed_c)[name] as a new fp32 CPU tensor."""
        return self.add_to(torch.zeros(tuple(shape), dtype=torch.float32), name, generator, buffer, scheme)


@dataclass(frozen=True)
class ParamFilter:
    """Which parameters are perturbed: names matching `include` and not matching `exclude` (regex, search)."""

    include: str = ".*"
    exclude: str = ""

    def __post_init__(self):
        for label, pattern in (("include", self.include), ("exclude", self.exclude)):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise CorpError(f"parameter filter --{label} '{pattern}' is not a valid regex: {exc}") from None

    def __call__(self, name: str) -> bool:
        if not re.search(self.include, name):
            return False
        return not (self.exclude and re.search(self.exclude, name))


def selected_parameters(model: torch.nn.Module, param_filter: ParamFilter) -> list[tuple[str, torch.nn.Parameter]]:
    """Canonical (HF) names of the selected parameters; tied weights appear once, under their first name."""
    params = [(n, p) for n, p in model.named_parameters() if param_filter(n)]
    if not params:
        raise CorpError(
            f"parameter filter (include '{param_filter.include}', exclude "
            f"'{param_filter.exclude}') selects no parameter of the model"
        )
    return params


def weights_hash(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer in name order: identifies a base model's weights exactly."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _shared_order(terms: list[Merged]) -> tuple[dict[tuple[int, float], int], list[Merged], list[Merged]]:
    """For `Perturber.keep_merged`: the (seed, sigma) order of first appearance over `terms`, and the
    terms whose components follow it (built in the shared pass) apart from those that do not (built
    on their own), so every M gets its components in its own order."""
    order: dict[tuple[int, float], int] = {}
    for t in terms:
        for c in t.components:
            order.setdefault((c.seed, c.sigma), len(order))
    shared, alone = [], []
    for t in terms:
        pos = [order[(c.seed, c.sigma)] for c in t.components]
        (shared if all(a < b for a, b in zip(pos, pos[1:])) else alone).append(t)
    return order, shared, alone


def _noise_users(
    shared: list[Merged], order: dict[tuple[int, float], int]
) -> tuple[dict[tuple[int, float], list[tuple[int, float]]], list[tuple[int, float]]]:
    """For the shared pass: per (seed, sigma), the (term position, coef * sigma) of every shared term
    that uses it with a nonzero coefficient, and those noises in the shared order."""
    users: dict[tuple[int, float], list[tuple[int, float]]] = {}
    for j, t in enumerate(shared):
        for c in t.components:
            if c.coef != 0.0:
                users.setdefault((c.seed, c.sigma), []).append((j, c.coef * c.sigma))
    sequence = sorted(users, key=order.__getitem__)  # the shared order: each term gets its components in its own order
    return users, sequence


def _build_merged(
    name: str,
    shape: torch.Size,
    scratch: Scratch,
    scheme: str,
    shared: list[Merged],
    alone: list[Merged],
    users: dict[tuple[int, float], list[tuple[int, float]]],
    sequence: list[tuple[int, float]],
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One tensor's M for every term of `Perturber.keep_merged` (the shared ones, then those built
    alone), with this worker's own generator and buffers."""
    n = shape.numel()
    gen, buf, tmp = scratch.gen, scratch.buffer("noise", n), scratch.buffer("tmp", n)
    if lowrank_rank(scheme) is not None:  # same bits from the factors, a block of E at a time
        terms = [(seed, users[(seed, sigma)]) for seed, sigma in sequence]
        Ms = merged_noise(terms, len(shared), name, shape, scheme, gen)
        return Ms, [materialise(t.components, name, shape, gen, buf, scheme) for t in alone]
    Ms = [torch.zeros(tuple(shape), dtype=torch.float32) for _ in shared]
    for seed, sigma in sequence:
        eps = noise(seed, name, shape, gen, out=buf[:n].view(shape), scheme=scheme)
        for j, f in users[(seed, sigma)]:
            Ms[j].add_(torch.mul(eps, f, out=tmp[:n].view(shape)))
    return Ms, [materialise(t.components, name, shape, gen, buf, scheme) for t in alone]


class Perturber:
    """Apply directions to a model in place, always starting from a pristine copy of the base."""

    def __init__(
        self,
        model: torch.nn.Module,
        param_filter: ParamFilter | None = None,
        base_device: str | torch.device = "cpu",
        scheme: str = SCHEME_VERSION,
        pristine: dict[str, torch.Tensor] | None = None,
    ):
        """`pristine`: tensors that may already hold the base (the mapped checkpoint: `pristine_base`)."""
        self.model = model
        # The noise scheme belongs to the run (its population or recipe), not to a direction: one
        # Perturber materialises every direction of a run under that run's scheme.
        self.scheme = check_scheme(scheme, "Perturber")
        self.param_filter = param_filter or ParamFilter()
        self.params = selected_parameters(model, self.param_filter)
        check_shapes(self.scheme, [(n, p.shape) for n, p in self.params])  # a low-rank scheme's rank fits every matrix
        # The pristine copy lives on the host by default so that GPU memory holds one model.
        self.base = pristine_base(self.params, base_device, pristine or {})
        self.current: Direction | None = None
        self._scratch = ScratchPool()  # generators and noise buffers, one per worker, reused across specialists
        self._prefix: tuple[list[Component], dict[str, torch.Tensor]] | None = None
        # M of the merged terms applied last, per tensor (fp32, host): a step search applies the
        # same M at several scales, and building M regenerates the noise of every merged component.
        # Costs one fp32 copy of the selected weights per merged term of the current direction.
        self._kept: dict[tuple[Component, ...], dict[str, torch.Tensor]] = {}
        self._pinned: set[tuple[Component, ...]] = set()  # built by keep_merged: kept until release_merged
        self._moved = False  # move_base has made the base an fp32 master (ES's centre)
        self._prefetched = None  # (direction, future of its tensors, thread): prefetch
        self._prefetch_scratch = ScratchPool()  # its own generators and buffers: it runs beside apply's

    @property
    def n_selected(self) -> int:
        return sum(p.numel() for _, p in self.params)

    @torch.no_grad()
    def cache_prefix(self, direction: Direction | None) -> None:
        """Materialise W0 + direction once (fp32, host); later directions that start with the same
        components start from it. Exact: components are added in order either way, so the bits are
        those of applying the whole direction from W0. Costs one more copy of the selected weights."""
        if direction is None or not direction.components or not direction.prefixable:
            self._prefix = None  # only seed-component directions are cached as prefixes
            return
        self._make_room(direction)

        def build(name: str, shape: torch.Size, scratch: Scratch) -> tuple[str, torch.Tensor]:
            return name, self._add(direction, self.base[name].to("cpu", torch.float32, copy=True), name, scratch)

        self._prefix = (list(direction.components), dict(per_tensor(build, self._shapes(), self._scratch)))

    def release_merged(self, keep: Iterable[Merged] = ()) -> None:
        """Free the kept M of merged terms (they are rebuilt, same bits, when applied again), except
        those of the terms in `keep`."""
        stay = {t.components for t in keep}
        self._kept = {c: m for c, m in self._kept.items() if c in stay}
        self._pinned = {c for c in self._pinned if c in stay}

    @torch.no_grad()
    def keep_merged(self, terms: Iterable[Merged]) -> None:
        """Build the M of several merged terms in one pass over their components' noise and keep
        them (pinned) until `release_merged`: each (seed, sigma) noise tensor is generated once for
        all the terms that use it. Costs one fp32 copy of the selected weights per term.

        Bits equal `materialise` per term: every M still receives round(eps * coef * sigma) in its
        own component order, starting from zeros. That needs one shared order in which every term's
        components appear in their own order; a term that does not fit it is built on its own."""
        terms = list(dict.fromkeys(t for t in terms if t.components not in self._kept))
        order, shared, alone = _shared_order(terms)
        users, sequence = _noise_users(shared, order)
        for t in shared + alone:
            self._kept[t.components] = {}
            self._pinned.add(t.components)
        scheme = self.scheme

        def build(name: str, shape: torch.Size, scratch: Scratch) -> tuple[str, list[torch.Tensor], list[torch.Tensor]]:
            return name, *_build_merged(name, shape, scratch, scheme, shared, alone, users, sequence)

        # Tensors are independent (each has its own noise stream) and torch draws one tensor's
        # normals on one core, which is most of the work: building tensors on parallel workers uses
        # every core and gives the same bits (results/step-search).
        for name, Ms, Ms_alone in per_tensor(build, self._shapes(), self._scratch):
            for t, M in zip(shared + alone, Ms + Ms_alone):
                self._kept[t.components][name] = M

    def _make_room(self, direction: Direction) -> None:
        """An entry in _kept for each merged term of `direction`, made before workers fill it."""
        for t in direction.components:
            if isinstance(t, Merged):
                self._kept.setdefault(t.components, {})

    def _shapes(self) -> list[tuple[str, torch.Size]]:
        return [(n, p.shape) for n, p in self.params]

    def _add(self, direction: Direction, target: torch.Tensor, name: str, scratch: Scratch) -> torch.Tensor:
        """direction.add_to(target, name) with the merged terms' M taken from (or kept in) _kept:
        `materialise` builds M either way, so the bits are those of add_to. Called on a worker:
        `scratch` is its own."""
        gen, buf = scratch.gen, scratch.buffer("noise", target.numel())
        if not direction.prefixable:
            return direction.add_to(target, name, gen, buf, scheme=self.scheme)
        return direction.add_to(target, name, gen, buf, scheme=self.scheme, merged_m=self._kept_m)

    def _kept_m(self, t: Merged, name: str, shape, gen: torch.Generator, buf: torch.Tensor) -> torch.Tensor:
        kept = self._kept[t.components]  # made by apply before its workers start
        if name not in kept:
            kept[name] = materialise(t.components, name, shape, gen, buf, self.scheme)
        return kept[name]

    def prefetch(self, direction: Direction | None) -> None:
        """Start materialising W0 + direction (fp32, host) on a background thread, so that the next
        specialist's noise is drawn while the current one generates; `apply(direction)` then only
        copies. The same additions on the same base as `apply`: the same bits. Only plain seed
        components (a population's specialists); costs one fp32 copy of the selected weights."""
        self._drop_prefetch()
        if direction is None or not direction.components or not direction.prefixable:
            return
        if any(not isinstance(t, Component) for t in direction.components):
            return
        base, scheme, shapes = self.base, self.scheme, self._shapes()

        def build() -> dict[str, torch.Tensor]:
            def one(name: str, shape: torch.Size, scratch: Scratch) -> tuple[str, torch.Tensor]:
                acc = base[name].to("cpu", torch.float32, copy=True)
                direction.add_to(acc, name, scratch.gen, scratch.buffer("noise", shape.numel()), scheme=scheme)
                return name, acc

            return dict(per_tensor(one, shapes, self._prefetch_scratch))

        pool = ThreadPoolExecutor(1, thread_name_prefix="corp-prefetch")
        self._prefetched = (direction, pool.submit(build), pool)

    def _drop_prefetch(self) -> None:
        if self._prefetched is not None:
            _, future, pool = self._prefetched
            future.cancel()
            pool.shutdown(wait=True)
            self._prefetched = None

    def _take_prefetched(self, direction: Direction) -> dict[str, torch.Tensor] | None:
        if self._prefetched is None or self._prefetched[0] != direction:
            self._drop_prefetch()
            return None
        _, future, pool = self._prefetched
        self._prefetched = None
        try:
            return future.result()
        finally:
            pool.shutdown(wait=False)

    @torch.no_grad()
    def apply(self, direction: Direction | None) -> None:
        """Set the selected weights to W0 + direction (None means W0)."""
        if direction is None or direction.is_zero():
            self._drop_prefetch()
            self.restore()
            return
        ready = self._take_prefetched(direction)
        if ready is not None:
            for name, param in self.params:
                param.copy_(ready[name].to(param.device, param.dtype))
            self.current = direction
            return
        start, rest = self.base, direction
        if self._prefix is not None and direction.prefixable:
            comps, tensors = self._prefix
            if direction.components[: len(comps)] == comps:
                start, rest = tensors, Direction(direction.components[len(comps) :])
        if direction.prefixable:  # keep only the M this direction uses: memory stays at its merged terms
            wanted = {t.components for t in rest.components if isinstance(t, Merged)}
            self._kept = {k: v for k, v in self._kept.items() if k in wanted or k in self._pinned}
            self._make_room(rest)
        params = dict(self.params)

        def set_one(name: str, shape: torch.Size, scratch: Scratch) -> None:
            param, base = params[name], start[name]
            if param.dtype == torch.float32 and param.device.type == "cpu" and base.dtype == torch.float32:
                param.copy_(base)  # accumulate straight into the parameter: no extra copy
                self._add(rest, param.data, name, scratch)
            else:
                acc = base.to("cpu", torch.float32, copy=True)
                self._add(rest, acc, name, scratch)
                param.copy_(acc.to(param.device, param.dtype))

        # Tensors are independent (each has its own noise stream), so workers set them in parallel
        # with the same bits; torch draws one tensor's normals on one core.
        for _ in per_tensor(set_one, self._shapes(), self._scratch):
            pass
        self.current = direction

    @torch.no_grad()
    def move_base(self, components: Iterable[Component]) -> None:
        """The base moves by `components` (ES's centre): from the first move the pristine copy is an
        fp32 master, and each move adds its components in order with `Direction.add_to`, the
        operations `apply(Direction(all components so far))` performs on W0, so a recipe of every
        component rebuilds the moved base bit-exactly. The current direction is re-applied on the
        new base; cached prefixes and merged terms built on the old base are dropped."""
        self._drop_prefetch()  # built on the old base
        if not self._moved:
            self.base = {n: b.to(torch.float32, copy=True) for n, b in self.base.items()}
            self._moved = True
        d = Direction(list(components))

        def one(name: str, shape: torch.Size, scratch: Scratch) -> None:
            d.add_to(self.base[name], name, scratch.gen, scratch.buffer("noise", shape.numel()), scheme=self.scheme)

        for _ in per_tensor(one, self._shapes(), self._scratch):
            pass
        self._prefix = None
        self.release_merged()
        self.apply(self.current)

    @torch.no_grad()
    def restore(self) -> None:
        for name, param in self.params:
            param.copy_(self.base[name])
        self.current = None
