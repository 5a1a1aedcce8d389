"""A merged term's M kept on disk between pushes (corp.algorithms.perturb.merged_files): the same bits
as `Direction.add_to`, no noise drawn for a term already written, a full disk or a bad file falls
back to building M, and the files go when the store does."""

from __future__ import annotations

import errno
import os
import socket

import pytest
import torch

import corp.algorithms.perturb.merged_files as mf
from corp.algorithms.perturb.direction import Component, Direction, Merged
from corp.algorithms.perturb.merged_files import MergedFiles, remove_stale
from corp.algorithms.perturb.workers import ScratchPool, per_tensor

# shapes whose sizes are not multiples of 16 (the noise stream's piece), a vector, and one over 1M elements
SHAPES = {"a.weight": (37, 29), "a.bias": (29,), "b.weight": (1031, 1030), "c.weight": (16, 8)}
ELITES = tuple(
    Component(s, 1e-3 * (1 + s % 3), c) for s, c in [(11, 0.5), (7, -0.25), (123, 1.0), (5, 0.125), (8, 2.0), (9, -1.0)]
)


def _base(name, shape):
    return torch.linspace(-1, 1, int(torch.Size(shape).numel()), dtype=torch.float32).view(shape) * (1 + len(name))


def _push(direction, store=None, scheme="corp-noise-v2"):
    """Every tensor of base + direction, built on parallel workers as the vLLM worker builds them."""

    def one(name, shape, scratch):
        acc = _base(name, shape).clone()
        buf = scratch.buffer("noise", shape.numel())
        if store is None:
            return name, direction.add_to(acc, name, scratch.gen, buf, scheme=scheme)
        return name, store.add_to(direction, acc, name, scratch.gen, buf)

    if store is not None:
        store.prepare(direction)
    return dict(per_tensor(one, [(n, torch.Size(s)) for n, s in SHAPES.items()], ScratchPool()))


def _store(tmp_path, **kw):
    return MergedFiles([(n, torch.Size(s)) for n, s in SHAPES.items()], directory=tmp_path, **kw)


class Projected(Direction):
    """A direction built otherwise than from its components in order (as a projected low-rank step is)."""

    prefixable = False


def _same(a, b):
    assert a.keys() == b.keys()
    for n in a:
        assert torch.equal(a[n], b[n]), n


@pytest.mark.parametrize("scheme", ["corp-noise-v2", "corp-noise-v1", "corp-lowrank-v1:r=4"])
def test_every_push_has_the_bits_of_add_to(tmp_path, scheme):
    store = _store(tmp_path, scheme=scheme)
    m = Direction.merged(ELITES)
    extra = Direction.single(99, 2e-3, 0.5)  # a plain component beside the merged term, as a centre + step
    for alpha in (1.0, 2.0, 0.3, 8.0):  # the first push writes M, the others read it
        d = extra + m.scaled(alpha)
        _same(_push(d, store, scheme), _push(d, None, scheme))
    assert len(store.kept()) == 1


def test_a_term_already_written_draws_no_noise(tmp_path, monkeypatch):
    built = []
    real = mf.materialise
    monkeypatch.setattr(mf, "materialise", lambda *a, **k: built.append(a[1]) or real(*a, **k))
    store = _store(tmp_path)
    m = Direction.merged(ELITES)
    _push(m.scaled(1.0), store)
    assert sorted(built) == sorted(SHAPES)  # built once per tensor
    built.clear()
    _push(m.scaled(4.0), store)
    _push(m.scaled(0.5), store)
    assert built == []
    _push(Direction.merged(ELITES[:5]), store)  # another term is built
    assert sorted(built) == sorted(SHAPES)


def test_at_most_max_terms_files_and_the_current_ones_stay(tmp_path):
    store = _store(tmp_path, max_terms=2)
    terms = [Direction.merged(ELITES[:k]) for k in (4, 5, 6)]
    for d in terms:
        _push(d, store)
    assert len(store.kept()) == 2 and len(list(tmp_path.glob("*.f32"))) == 2
    both = Direction([*terms[0].components, *terms[2].components])  # two terms in one push: neither removed
    _same(_push(both, store), _push(both))
    assert len(store.kept()) == 2
    assert store._files.keys() == {terms[0].components[0].components, terms[2].components[0].components}


def test_a_full_disk_builds_m_each_time_and_says_so(tmp_path, monkeypatch, capsys):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mf.os, "posix_fallocate", full)
    store = _store(tmp_path)
    d = Direction.merged(ELITES, 2.0)
    _same(_push(d, store), _push(d))
    err = capsys.readouterr().err
    assert "No space left on device" in err and "rebuilt at each push" in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == [] and store.kept() == []


def test_a_file_that_cannot_be_read_back_is_built_again(tmp_path, monkeypatch):
    store = _store(tmp_path)
    d = Direction.merged(ELITES)
    _push(d, store)

    def broken(fd, m, offset):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(mf, "_read_into", broken)
    _same(_push(d.scaled(3.0), store), _push(d.scaled(3.0)))


def test_the_files_go_with_the_store(tmp_path):
    store = _store(tmp_path)
    _push(Direction.merged(ELITES), store)
    assert len(list(tmp_path.glob("*.f32"))) == 1
    store.close()
    assert list(tmp_path.glob("*.f32")) == []
    other = _store(tmp_path)
    _push(Direction.merged(ELITES), other)
    del other  # the finalizer, as at the end of the process
    import gc

    gc.collect()
    assert list(tmp_path.glob("*.f32")) == []


def test_only_files_of_dead_processes_of_this_host_are_removed(tmp_path):
    host = socket.gethostname()
    dead = 2**22 + 12345  # above pid_max's default: no such process
    names = {
        "dead": f"merged-{host}-{dead}-x.f32",
        "alive": f"merged-{host}-{os.getppid()}-x.f32",
        "mine": f"merged-{host}-{os.getpid()}-x.f32",
        "other host": f"merged-elsewhere-{dead}-x.f32",
        "not ours": f"{dead}.f32",
    }
    for n in names.values():
        (tmp_path / n).write_bytes(b"x")
    assert remove_stale(tmp_path) == [str(tmp_path / names["dead"])]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(v for k, v in names.items() if k != "dead")


def test_a_direction_without_merged_terms_or_with_few_noises_opens_no_file(tmp_path, monkeypatch):
    store = _store(tmp_path)
    d = Direction([Component(3, 1e-3, 1.0), Component(4, 2e-3, -1.0)])
    _same(_push(d, store), _push(d))
    assert store.kept() == [] and not isinstance(d.components[0], Merged)
    # three noises (and a zero coefficient, which draws none): built each time, as cheap as reading M back
    few = Direction.merged([*ELITES[:3], Component(77, 1e-3, 0.0)]) + Direction.merged(ELITES)
    _same(_push(few, store), _push(few))
    assert len(store.kept()) == 1


def test_a_direction_of_more_merged_terms_than_files_builds_the_rest(tmp_path):
    """CoRP's stage 2 pushes centre + step: the stage-1 term, each accepted round's and the new one. The
    store never holds more than max_terms files; the others are built each time, with the same bits."""
    store = _store(tmp_path, max_terms=2)
    terms = [Direction.merged(ELITES[:k], 0.5 * k) for k in (4, 5, 6)]
    d = terms[0] + terms[1] + terms[2]
    for _ in range(2):
        _same(_push(d, store), _push(d))
        assert len(store.kept()) == 2 and len(list(tmp_path.glob("*.f32"))) == 2


def test_a_direction_not_built_from_its_components_opens_no_file(tmp_path):
    store = _store(tmp_path)
    d = Projected(Direction.merged(ELITES).components)
    _same(_push(d, store), _push(d))
    assert store.kept() == [] and list(tmp_path.iterdir()) == []


def test_a_disk_without_room_beside_the_reserve_keeps_nothing_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(mf, "reserve_bytes", lambda total: total)  # no disk has all of itself free
    store = _store(tmp_path)
    d = Direction.merged(ELITES, 2.0)
    _same(_push(d, store), _push(d))
    err = capsys.readouterr().err
    assert "kept free" in err and "rebuilt at each push" in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_an_older_terms_file_gives_way_when_the_disk_has_room_for_one(tmp_path, monkeypatch):
    real = mf.reserve_bytes
    # room for one file only: the reserve grows to the whole disk while any file exists
    monkeypatch.setattr(mf, "reserve_bytes", lambda total: total if list(tmp_path.glob("*.f32")) else real(total))
    store = _store(tmp_path)
    first, second = Direction.merged(ELITES[:4]), Direction.merged(ELITES)
    _push(first, store)
    assert len(store.kept()) == 1
    _same(_push(second, store), _push(second))
    assert store.kept() and store._files.keys() == {second.components[0].components}


def test_stale_files_of_a_host_whose_name_prefixes_anothers_are_left(tmp_path, monkeypatch):
    monkeypatch.setattr(mf.socket, "gethostname", lambda: "vm")
    dead = 2**22 + 12345
    theirs = f"merged-vm-2-{dead}-abc.f32"  # host vm-2's file: not this host's pid 2
    mine = f"merged-vm-{dead}-abc.f32"
    for n in (theirs, mine):
        (tmp_path / n).write_bytes(b"x")
    assert remove_stale(tmp_path) == [str(tmp_path / mine)]
    assert [p.name for p in tmp_path.iterdir()] == [theirs]


def test_a_tensor_with_no_elements_is_pushed_like_the_others(tmp_path):
    shapes = [("w", torch.Size((5, 7))), ("empty", torch.Size((0, 3)))]  # memoryview cannot cast an empty 2-D view
    store = MergedFiles(shapes, directory=tmp_path)
    for alpha in (1.0, 2.0):  # written, then read back
        d = Direction.merged(ELITES, alpha)
        store.prepare(d)
        for name, shape in shapes:
            got = store.add_to(d, torch.zeros(shape), name, torch.Generator())
            assert torch.equal(got, d.add_to(torch.zeros(shape), name)), name
