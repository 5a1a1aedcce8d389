"""Issue 57: `--executor ray --workers 5` on 2 cores ran 2.5x slower than local with no line (and
`--threads 3 --workers 2`): a local Ray corp starts is given workers x threads CPUs whatever the
machine has, so asking for more than the machine's CPUs is one warning line before any work."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from corp.config import load_config

pytest.importorskip("ray")


class Started(Exception):
    """Raised where Ray would start: everything before it is what a run does before any work."""


def _start(*a, **k):
    raise Started


@pytest.fixture
def two_cpus(monkeypatch):
    import ray

    from corp.runtime import ray_cluster

    if ray.is_initialized():
        pytest.skip("a Ray is already running in this process (corp starts none then)")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(ray_cluster, "machine_cpus", lambda: 2, raising=False)


@pytest.mark.parametrize(
    "workers, threads, need", [(5, None, "5 worker(s) x 1 thread(s) = 5 CPUs"), (2, 3, "= 6 CPUs")]
)
def test_more_workers_or_threads_than_cpus_is_one_line_before_ray_starts(two_cpus, monkeypatch, workers, threads, need):
    from corp.config import PopulationConfig
    from corp.runtime import executors

    monkeypatch.setattr(executors, "init_ray", _start)
    cfg = load_config(
        PopulationConfig, None, {"executor": "ray", "workers": workers, "threads": threads, "backend": "hf"}
    )
    with pytest.warns(UserWarning) as seen, pytest.raises(Started):
        executors.RayExecutor(cfg, workers)
    (line,) = [str(w.message) for w in seen if "--executor ray" in str(w.message)]
    assert need in line and "this machine has 2" in line and "at once" in line, line
    assert "--workers 2 --threads 1" in line and "--executor local" in line, line


def test_a_run_that_fits_says_nothing(two_cpus, monkeypatch, recwarn):
    from corp.config import PopulationConfig
    from corp.runtime import executors

    monkeypatch.setattr(executors, "init_ray", _start)
    cfg = load_config(PopulationConfig, None, {"executor": "ray", "workers": 2, "backend": "hf"})
    with pytest.raises(Started):
        executors.RayExecutor(cfg, 2)
    assert not [w for w in recwarn if "--executor ray" in str(w.message)]


def test_the_bench_on_a_local_ray_says_it_too(two_cpus, monkeypatch):
    from corp.bench.schedule import ray_cells

    monkeypatch.setattr(ray_cells, "init_ray", _start)
    bench = SimpleNamespace(cfg=SimpleNamespace(threads=None, ray_address=None, workers=4))
    with pytest.warns(UserWarning, match=r"4 worker\(s\) x 1 thread\(s\) = 4 CPUs"), pytest.raises(Started):
        ray_cells.run_cells_on_ray(bench, [], lambda c: True)
