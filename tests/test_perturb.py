import hashlib
from pathlib import Path

import pytest
import torch

from corp.algorithms.perturb import (
    SCHEME_VERSION,
    Component,
    Direction,
    ParamFilter,
    Perturber,
    noise,
    noise_key,
    specialist_seeds,
)
from corp.algorithms.perturb.noise import seed_generator
from corp.errors import CorpError

V1, V2 = "corp-noise-v1", "corp-noise-v2"
UP = "model.layers.0.mlp.up_proj.weight"
REPO = Path(__file__).resolve().parents[1]


def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_same_seed_same_noise_bit_identical():
    a = noise(123, "model.layers.0.mlp.up_proj.weight", (64, 32))
    b = noise(123, "model.layers.0.mlp.up_proj.weight", (64, 32))
    assert torch.equal(a, b)
    assert not torch.equal(a, noise(124, "model.layers.0.mlp.up_proj.weight", (64, 32)))


def test_same_shape_tensors_get_different_noise():
    a = noise(7, "model.layers.0.self_attn.q_proj.weight", (32, 32))
    b = noise(7, "model.layers.0.self_attn.o_proj.weight", (32, 32))
    assert not torch.equal(a, b)
    assert abs(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1]) < 0.1


def test_noise_is_standard_normal_and_regenerable_alone():
    x = noise(1, "w", (200_000,))
    assert abs(x.mean().item()) < 0.01 and abs(x.std().item() - 1) < 0.01
    buf = torch.empty(10, 10)
    assert torch.equal(noise(1, "w2", (10, 10), out=buf), noise(1, "w2", (10, 10)))


def test_specialist_seeds_distinct_and_prefix_stable():
    s = specialist_seeds(0, 50)
    assert len(set(s)) == 50
    assert specialist_seeds(0, 10) == s[:10]
    assert specialist_seeds(1, 10) != s[:10]


def test_hundred_apply_restore_cycles_bit_exact(tiny_model):
    before = snapshot(tiny_model)
    pert = Perturber(tiny_model)
    for i in range(100):
        pert.apply(Direction.single(i, 1e-2 * (1 + i % 3)))
        if i % 2:
            pert.restore()
    pert.restore()
    after = snapshot(tiny_model)
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_direction_applied_twice_identical_and_changes_weights(tiny_model):
    pert = Perturber(tiny_model)
    base = snapshot(tiny_model)
    d = Direction([Component(5, 1e-2, 1.0), Component(9, 2e-2, -0.5)])
    pert.apply(d)
    first = snapshot(tiny_model)
    pert.apply(Direction.single(77, 0.1))  # something else in between
    pert.apply(d)
    second = snapshot(tiny_model)
    assert all(torch.equal(first[n], second[n]) for n in first)
    assert any(not torch.equal(first[n], base[n]) for n in first)


def test_apply_equals_formula_and_fast_path_matches_general(tiny_model):
    pert = Perturber(tiny_model)
    name, param = pert.params[0]
    w0 = param.detach().clone()
    pert.apply(Direction.single(3, 0.05, 2.0))
    expected = w0 + (noise(3, name, w0.shape) * (2.0 * 0.05))
    assert torch.equal(param.detach(), expected)
    # the general (multi-component / non-fp32) path materialises the same bits
    acc = w0.clone()
    Direction.single(3, 0.05, 2.0).add_to(acc, name)
    assert torch.equal(acc, param.detach())


def test_per_tensor_runs_tasks_at_once_each_with_its_own_scratch(monkeypatch):
    # three tasks wait for each other at a barrier: it opens only if three workers run them at
    # once, and then each must hold a Scratch no other holds (a shared one races on its buffers)
    import threading

    import corp.algorithms.perturb.workers as workers_module

    monkeypatch.setattr(workers_module, "tensor_workers", lambda numel: 3)
    barrier, held = threading.Barrier(3, timeout=20), []

    def task(name, shape, scratch):
        barrier.wait()
        held.append(scratch)
        return name

    items = [(n, torch.Size((k,))) for n, k in (("a", 5), ("b", 7), ("c", 9))]
    pool = workers_module.ScratchPool()
    assert sorted(workers_module.per_tensor(task, items, pool)) == ["a", "b", "c"]
    assert len({id(s) for s in held}) == 3
    assert sorted(workers_module.per_tensor(lambda n, s, scratch: id(scratch), items[:1], pool))[0] in {
        id(s) for s in held
    }  # reused


def test_a_consumer_that_stops_does_not_wait_for_a_long_running_task(monkeypatch):
    """Planted: the consumer fails on the first result while another worker runs a task that would take 60 s
    (as one tensor's Gram part does at 1.5B): the stop reaches the running task (Scratch.stop), which ends, so
    leaving per_tensor takes seconds; the old code waited for the task (a stopped bench hung on it). And a
    Gram part whose stop is set ends before its first block pair."""
    import threading
    import time

    import corp.algorithms.perturb.workers as workers_module
    from corp.algorithms.corp_operator.algebra import Stopped, _tensor_gram

    monkeypatch.setattr(workers_module, "tensor_workers", lambda numel: 2)
    started = threading.Event()

    def task(name, shape, scratch):
        if name == "long":
            started.set()
            for _ in range(600):  # 60 s unless stopped
                if scratch.stop.is_set():
                    raise RuntimeError(f"{name} stopped")
                time.sleep(0.1)
            return name
        started.wait(10)
        return name

    items = [("long", torch.Size((9,))), ("short", torch.Size((3,)))]
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="consumer failed"):
        for _ in workers_module.per_tensor(task, items):
            raise RuntimeError("consumer failed")
    assert time.monotonic() - t0 < 10
    stop = threading.Event()
    stop.set()
    with pytest.raises(Stopped):
        _tensor_gram([1, 2], "w", (4, 4), 1 << 20, "corp-noise-v2", stop)


def test_workers_run_torch_operators_on_one_thread_and_the_main_thread_keeps_its_count(monkeypatch):
    # W workers with OpenMP teams of their own would run W x T threads on T cores
    import ctypes
    import os

    import sklearn.utils  # noqa: F401  (its own libgomp, mapped below torch's: the runtime must still be torch's)

    import corp.algorithms.perturb.workers as workers_module

    monkeypatch.setattr(workers_module, "tensor_workers", lambda numel: 2)
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    with open("/proc/self/maps") as maps:
        path = next(
            (line.split()[-1] for line in maps if "libgomp" in line and line.split()[-1].startswith(torch_dir)), None
        )
    if path is None:
        pytest.skip("torch does not run on a libgomp of its own here")
    omp = ctypes.CDLL(path)  # the runtime torch loaded (the same handle)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # a worker that kept torch's count would run 2 (other tests may leave 1)
    try:
        items = [(n, torch.Size((4,))) for n in "abc"]
        seen = list(
            workers_module.per_tensor(
                lambda n, s, scratch: (torch.mul(torch.ones(1 << 17), 2.0), omp.omp_get_max_threads())[1], items
            )
        )
        assert seen == [1, 1, 1]
        assert omp.omp_get_max_threads() == 2  # the main thread's own count is untouched
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("workers", [1, 3])
def test_apply_on_parallel_workers_gives_the_formula_bits_for_every_tensor(tiny_model, monkeypatch, workers):
    # apply sets tensors on parallel workers, each with its own generator and noise buffer: every
    # tensor must still get exactly add_to's bits, with a merged term, a prefix and plain components
    import corp.algorithms.perturb.workers as workers_module

    monkeypatch.setattr(workers_module, "tensor_workers", lambda numel: workers)
    pert = Perturber(tiny_model)
    w0 = {n: p.detach().clone() for n, p in pert.params}
    centre = Direction([Component(1, 0.02, 0.7), Component(2, 0.01, -1.3)])
    full = (
        centre + Direction.merged([Component(4, 0.03, 0.5), Component(5, 0.01, 2.0)], 1.5) + Direction.single(6, 0.05)
    )
    for prefix in (None, centre):
        pert.cache_prefix(prefix)
        pert.apply(full)
        for name, p in pert.params:
            assert torch.equal(p.detach(), full.add_to(w0[name].clone(), name)), (prefix, name)
    pert.restore()
    assert all(torch.equal(p.detach(), w0[n]) for n, p in pert.params)


def test_param_filter_selects_and_leaves_others_untouched(tiny_model):
    before = snapshot(tiny_model)
    pf = ParamFilter(include=r"mlp\.", exclude=r"down_proj")
    pert = Perturber(tiny_model, pf)
    assert pert.params and all("mlp." in n and "down_proj" not in n for n, _ in pert.params)
    pert.apply(Direction.single(1, 0.1))
    for n, p in tiny_model.named_parameters():
        changed = not torch.equal(p.detach(), before[n])
        assert changed == pf(n)


def test_direction_json_round_trip():
    d = Direction([Component(1, 1e-3, 0.5), Component(2, 2e-3, -1.0)])
    assert Direction.from_json(d.to_json()) == d


def test_cached_prefix_gives_the_same_bits_as_applying_from_scratch(tiny_model):
    pert = Perturber(tiny_model)
    centre = Direction([Component(1, 0.02, 0.7), Component(2, 0.01, -1.3)])
    full = centre + Direction.single(99, 0.05, 0.5)
    pert.apply(full)
    scratch = snapshot(tiny_model)
    pert.cache_prefix(centre)
    pert.apply(Direction.single(5, 0.1))  # not starting with the prefix: from W0
    pert.apply(full)
    cached = snapshot(tiny_model)
    assert all(torch.equal(scratch[n], cached[n]) for n in scratch)


def _low32_collision(name: str) -> tuple[int, int]:
    """Two seeds whose v1 keys agree in their low 32 bits (birthday search, ~70k keys, <0.2 s)."""
    seen: dict[int, int] = {}
    s = 0
    while True:
        low = noise_key(s, name, V1) & 0xFFFFFFFF
        if low in seen:
            return seen[low], s
        seen[low] = s
        s += 1


def test_v1_key_collision_shares_noise_and_v2_does_not():
    """The issue-10 defect: torch's manual_seed keeps the low 32 bits of v1's 63-bit key, so two
    specialists got bit-identical noise for a tensor. v2 must tell them apart."""
    a, b = _low32_collision(UP)
    assert noise_key(a, UP, V1) != noise_key(b, UP, V1)
    assert torch.equal(
        noise(a, UP, (64, 32), scheme=V1), noise(b, UP, (64, 32), scheme=V1)
    )  # the old bug, kept for old recipes
    assert not torch.equal(noise(a, UP, (64, 32), scheme=V2), noise(b, UP, (64, 32), scheme=V2))
    assert SCHEME_VERSION == V2


@pytest.mark.parametrize("bit", [0, 31, 32, 47, 63, 64, 100, 127])
def test_v2_generator_state_depends_on_every_key_bit(bit):
    """Any truncation of the 128-bit key (v1 kept 32 bits) would make some flipped bit invisible."""
    key = noise_key(3, UP, V2)
    assert key < 1 << 128
    x = torch.randn(256, generator=seed_generator(torch.Generator(), key, V2))
    y = torch.randn(256, generator=seed_generator(torch.Generator(), key ^ (1 << bit), V2))
    assert not torch.equal(x, y)


def test_v1_truncates_high_key_bits():
    # documents why v1 was replaced: bits above 31 of its key never reached the generator
    key = noise_key(3, UP, V1)
    x = torch.randn(64, generator=seed_generator(torch.Generator(), key, V1))
    assert torch.equal(x, torch.randn(64, generator=seed_generator(torch.Generator(), key ^ (1 << 40), V1)))


def test_v1_still_regenerates_bit_identically():
    """Old recipes and populations (results/consolidate-smollm2-arith) mean v1 noise: the v1 mapping
    is manual_seed(63-bit blake2b of 'corp-noise-v1|seed|name'), pinned by a digest taken from the
    code before the v2 change."""
    digest = hashlib.blake2b(f"corp-noise-v1|1008331279|{UP}".encode(), digest_size=8).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest, "little") & ((1 << 63) - 1))
    x = noise(1008331279, UP, (64, 32), scheme=V1)
    assert torch.equal(x, torch.randn((64, 32), generator=gen))
    assert (
        hashlib.sha256(x.numpy().tobytes()).hexdigest()
        == "ba86e0e0b04cb7ab50517b5ddb7765221765f2e3c1986162ac7f44c236fd6507"
    )


def test_v2_noise_deterministic_independent_and_reusing_a_generator_is_harmless():
    g = torch.Generator()
    a = noise(11, UP, (4096,), g)
    noise(12, "other", (10,), g, scheme=V1)  # a v1 draw in between must not leak state
    assert torch.equal(a, noise(11, UP, (4096,), g)) and torch.equal(a, noise(11, UP, (4096,)))
    b = noise(11, "model.layers.0.mlp.down_proj.weight", (4096,), g)
    c = noise(12, UP, (4096,), g)
    for other in (b, c):
        assert abs(torch.corrcoef(torch.stack([a, other]))[0, 1]) < 0.06  # 4096 draws: sd 0.016
    assert abs(a.mean()) < 0.06 and abs(a.std() - 1) < 0.05


def test_unknown_scheme_is_refused_clearly(tiny_model):
    with pytest.raises(CorpError, match="corp-noise-v9"):
        noise(1, "w", (3,), scheme="corp-noise-v9")
    with pytest.raises(CorpError, match="corp-noise-v9"):
        Perturber(tiny_model, scheme="corp-noise-v9")


def test_perturber_materialises_under_its_scheme(tiny_model):
    name, param = Perturber(tiny_model).params[0]
    w0 = param.detach().clone()
    d = Direction([Component(5, 1e-2, 1.0), Component(9, 2e-2, -0.5)])
    for scheme in (V1, V2):
        pert = Perturber(tiny_model, scheme=scheme)
        pert.apply(d)
        expected = (
            w0.clone()
            .add_(noise(5, name, w0.shape, scheme=scheme).mul_(1e-2))
            .add_(noise(9, name, w0.shape, scheme=scheme).mul_(2e-2 * -0.5))
        )
        assert torch.equal(param.detach(), expected), scheme
        pert.restore()


def test_recipe_of_an_older_scheme_loads_and_an_unknown_one_is_refused(tmp_path):
    import json

    from corp.algorithms.recipe import load_recipe

    recipe = json.loads((REPO / "results" / "consolidate-smollm2-arith" / "recipe.json").read_text())
    assert recipe["noise_scheme"] == V1  # the committed evidence run predates v2
    (tmp_path / "old.json").write_text(json.dumps(recipe))
    assert load_recipe(tmp_path / "old.json")["noise_scheme"] == V1
    (tmp_path / "bad.json").write_text(json.dumps({**recipe, "noise_scheme": "corp-noise-v9"}))
    with pytest.raises(CorpError, match=r"bad\.json.*corp-noise-v9"):
        load_recipe(tmp_path / "bad.json")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prefetched_specialist_has_the_bits_of_one_applied_from_scratch(tiny_model, dtype):
    """Perturber.prefetch builds the next specialist while the current one generates; apply then
    only copies. The weights must be those apply computes itself, and a prefetch of another
    direction (or one made before the base moved) must never be used."""
    model = tiny_model.to(dtype)
    fresh = Perturber(model)
    a, b, c = (Direction.single(s, 0.05) for s in (11, 12, 13))

    def weights():
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    fresh.apply(b)
    expected_b = weights()
    fresh.apply(c)
    expected_c = weights()
    fresh.restore()

    pert = Perturber(model)
    pert.apply(a)
    pert.prefetch(b)
    pert.apply(b)
    assert pert._prefetched is None, "the prefetched weights were not the ones used"
    got = weights()
    for n in expected_b:
        assert torch.equal(got[n], expected_b[n]), n
    pert.prefetch(b)  # prefetched b, but c is applied: c's own bits, not b's
    pert.apply(c)
    got = weights()
    for n in expected_c:
        assert torch.equal(got[n], expected_c[n]), n
    pert.prefetch(b)
    pert.move_base([Component(3, 0.05, 1.0)])  # the base moved: a prefetch built on the old one is dropped
    assert pert._prefetched is None
    pert.restore()


@pytest.mark.parametrize("scheme", ["corp-noise-v2", "corp-noise-v1", "corp-lowrank-v1:r=4"])
def test_a_noise_stream_in_pieces_has_the_bits_of_one_noise_call(scheme):
    """CoRP's Gram matrix draws each seed's noise piece by piece (`NoiseStream`): the pieces must be the bits of
    `noise()`. Planted where torch's randn differs: lengths not a multiple of 16 (it draws the last 16 again),
    under 16 (a scalar path), a remainder under 16 (joins the last piece), and low-rank rows."""
    from corp.algorithms.perturb.noise import NoiseStream, piece_bounds

    for shape in [(7,), (15,), (16,), (17,), (33,), (40, 30), (1001,), (999, 37), (5, 7), (4, 1 << 15)]:
        full = noise(12345, "w", shape, scheme=scheme).flatten()
        for piece in (16, 17, 32, 100, 1000, 1 << 20):
            bounds = piece_bounds(shape, piece, scheme)
            assert bounds[0][0] == 0 and bounds[-1][1] == full.numel()
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            stream, out = NoiseStream(12345, "w", shape, scheme), torch.empty(full.numel())
            for a, b in bounds:
                stream.fill(out[a:b], a, b)
            assert torch.equal(out, full), (shape, piece)
    # a naive cut (pieces of 10, the last of 1) gives other numbers: the rule is what keeps the bits
    gen = torch.Generator().manual_seed(3)
    naive = torch.cat([torch.randn(10, generator=gen) for _ in range(3)] + [torch.randn(1, generator=gen)])
    assert not torch.equal(naive, torch.randn(31, generator=torch.Generator().manual_seed(3)))
    with pytest.raises(ValueError, match="in order"):
        NoiseStream(1, "w", (64,), scheme).fill(torch.empty(16), 16, 32)
