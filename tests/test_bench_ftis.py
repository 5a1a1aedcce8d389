"""F-TIS in `corp bench` (issue 22, item 3): its adapter grows one run per seed through the budgets,
every party's FLOPs count against the budget, a resumed run equals an uninterrupted one, a resumed
bench computes nothing, and a budget too small for it is refused before compute.

Two tiny random models of different sizes and tokenizers stand in for SmolLM2 (node 0, the bench's
model) and Gemma 3 270M (node 1), as in tests/test_ftis.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from corp.bench.config import BenchConfig
from corp.config import load_config
from corp.errors import CorpError
from corp.runtime.ledger import flops
from tests.conftest import make_char_tokenizer, make_tiny_llama
from tests.test_ftis import make_other_tokenizer
from tests.test_methods import count_model_calls


def _save(model, tok, d: Path) -> str:
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """(node 0's directory, node 1's): another tokenizer and another size, so a ledger charged at
    node 0's size for both parties, or one party left out, shows."""
    root = tmp_path_factory.mktemp("ftis-models")
    a_tok, b_tok = make_char_tokenizer(), make_other_tokenizer()
    a = _save(make_tiny_llama(a_tok, seed=0), a_tok, root / "a")
    b_model = make_tiny_llama(b_tok, seed=1, hidden=48)
    b_model.generation_config.eos_token_id = b_tok.eos_token_id
    return a, _save(b_model, b_tok, root / "b")


FTIS_OPTIONS = {"prompts_per_step": 2, "num_generations": 2, "learning_rate": 1e-3}


def bench_options(a: str, b: str, root: Path, **over) -> dict:
    opts = dict(
        name="tiny-ftis",
        model=a,
        tasks=[{"task": "arith", "label": "add"}],
        seeds=[1],
        budgets=[5e8, 1e9],
        settings=["equal-data"],
        population=4,
        sigmas=[0.05],
        n_support=4,
        n_probe=2,
        n_validation=2,
        n_test=4,
        max_new_tokens=4,
        batch_size=8,
        threads=1,
        reward="tests.test_methods:text_checksum",
        results_dir=str(root / "results"),
        work_dir=str(root / "work"),
        methods={"ftis": {"options": {**FTIS_OPTIONS, "nodes": f"{a},{b}"}}},
        compare=[],
    )
    opts.update(over)
    return opts


@pytest.fixture(scope="module")
def benched(two_models, tmp_path_factory):
    from corp.bench.sweep import run_bench

    a, b = two_models
    root = tmp_path_factory.mktemp("bench-ftis")
    summary = run_bench(load_config(BenchConfig, None, bench_options(a, b, root)), "corp bench")
    with count_model_calls() as again:
        resumed = run_bench(load_config(BenchConfig, None, bench_options(a, b, root)), "corp bench")
    records = sorted(
        (json.loads(p.read_text()) for p in (root / "results" / "tiny-ftis" / "cells").glob("*.json")),
        key=lambda r: r["budget"],
    )
    return {"root": root, "summary": summary, "resumed": resumed, "again": dict(again), "records": records}


def _metrics(run_dir: str) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_ftis_runs_at_each_budget_within_it(benched):
    assert "ftis" not in benched["summary"]["missing"]
    recs = benched["records"]
    assert [r["budget"] for r in recs] == [5e8, 1e9] and all(r["method"] == "ftis" for r in recs)
    for rec in recs:
        assert rec["status"] == "done" and rec["kind"] == "iterative", rec
        assert rec["units"] >= 1 and rec["flops"] <= rec["budget"], (rec["units"], rec["flops"], rec["budget"])
        assert [r["name"] for r in rec["rows"]] == ["ftis"] and rec["rows"][0]["report_row"] == "node0-ftis"
        fit = [g for g in rec["grown"] if g["flops"] <= rec["budget"]]  # the last growth within the budget is the cell
        assert fit[-1] == {"units": rec["units"], "flops": rec["flops"]}
    # one run grown through both budgets: the larger buys more steps (one step of both tiny nodes is about 2.4e8)
    assert recs[0]["units"] < recs[1]["units"] and recs[0]["run_dir"] == recs[1]["run_dir"]
    # equal data: F-TIS trains on support + probe + validation, like GRPO
    cfg = (Path(recs[0]["run_dir"]) / "config.yaml").read_text()
    assert "n_support: 8" in cfg and "n_probe: 0" in cfg


def test_every_party_s_flops_count(benched, two_models):
    """The cell's FLOPs are the sum of both nodes' ledgers at the recorded step, each at its own model's
    size: not node 0's alone, and not node 1's tokens at node 0's size."""
    from corp.runtime.runs import read_json

    a, b = two_models
    for rec in benched["records"]:
        at = {r["node"]: r for r in _metrics(rec["run_dir"]) if r["arm"] == "ftis" and r["step"] == rec["units"]}
        assert set(at) == {0, 1}
        n0, n1 = at[0]["ledger_n_params"], at[1]["ledger_n_params"]
        assert n0 != n1  # two model sizes: charging both at one size would show
        for r in at.values():  # each party's ledger holds its generation, logprob forwards and training
            assert r["ledger_generated_tokens"] > 0 and r["ledger_trained_tokens"] > 0
            assert r["ledger_flops"] == flops(
                r["ledger_n_params"],
                r["ledger_prompt_tokens"],
                r["ledger_generated_tokens"],
                r["ledger_trained_tokens"],
            )
        assert rec["flops"] == pytest.approx(at[0]["ledger_flops"] + at[1]["ledger_flops"], rel=1e-12)
        assert rec["flops"] > 1.5 * at[0]["ledger_flops"]  # node 1 (the larger model) is more than half of it
    report = read_json(Path(benched["records"][-1]["run_dir"]) / "report.json")
    parties = report["method_ledger_parties"]
    assert [p["model"] for p in parties] == [a, b]
    assert report["method_flops"] == sum(n["training_ledger"]["flops"] for n in report["nodes"])
    assert [p["flops"] for p in parties] == [n["training_ledger"]["flops"] for n in report["nodes"]]
    assert all(n["grpo_training_ledger"] is None for n in report["nodes"])  # the comparison arm is not run in a cell
    # node 1 is not evaluated on test in a cell (it would only feed F-TIS's own report)
    assert not any(k.startswith("node1-") for k in report["accuracy_per_step"]), report["accuracy_per_step"]


def test_a_resumed_bench_makes_no_method_call(benched):
    assert benched["resumed"]["method_calls"] == 0, benched["resumed"]
    assert benched["again"] == {"generate": 0, "forward": 0}, benched["again"]
    assert benched["resumed"]["reused"] == benched["resumed"]["cells"] == 2


def test_a_budget_below_one_ftis_step_is_refused_before_compute(two_models, tmp_path):
    from corp.bench.sweep import run_bench

    a, b = two_models
    with count_model_calls() as calls:
        with pytest.raises(CorpError, match="too small for every method") as err:
            run_bench(load_config(BenchConfig, None, bench_options(a, b, tmp_path, budgets=[1e3])), "corp bench")
    assert "\n" not in str(err.value) and calls == {"generate": 0, "forward": 0}
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").rglob("metrics.jsonl"))


@pytest.mark.parametrize(
    "nodes, message",
    [("{b},{a}", "put the bench's model first"), ("{a},{missing}", r"node 1 \(.*no-such-model")],
)
def test_nodes_are_checked_before_compute(nodes, message, two_models, tmp_path):
    """Node 0 must be the bench's model (the row is its), and a partner that cannot be loaded is one
    line before any cell runs."""
    from corp.bench.sweep import run_bench

    a, b = two_models
    opts = bench_options(a, b, tmp_path)
    opts["methods"]["ftis"]["options"]["nodes"] = nodes.format(a=a, b=b, missing=tmp_path / "no-such-model")
    with count_model_calls() as calls:
        with pytest.raises(CorpError, match=message) as err:
            run_bench(load_config(BenchConfig, None, opts), "corp bench")
    assert "\n" not in str(err.value) and calls == {"generate": 0, "forward": 0}


# ----------------------------------------------------------------------------- resume = uninterrupted


def _ftis_cfg(a: str, b: str, run_dir: Path, steps: int):
    from corp.methods.ftis import FTISConfig

    return load_config(
        FTISConfig,
        None,
        {
            **FTIS_OPTIONS,
            "nodes": f"{a},{b}",
            "model": a,
            "task": "arith",
            "steps": steps,
            "n_support": 4,
            "n_probe": 0,
            "n_validation": 0,
            "n_test": 3,
            "max_new_tokens": 4,
            "batch_size": 8,
            "reward": "tests.test_methods:text_checksum",
            "skip_grpo_baseline": True,
            "run_dir": str(run_dir),
        },
    )


def _weights(run_dir: Path) -> list[dict]:
    return [torch.load(run_dir / f"ftis-node{k}.pt", weights_only=False) for k in (0, 1)]


def _same_run(x: Path, y: Path) -> bool:
    wx, wy = _weights(x), _weights(y)
    same = all(
        p["step"] == q["step"]
        and p["ledger"] == q["ledger"]
        and p["trainable"].keys() == q["trainable"].keys()
        and all(torch.equal(p["trainable"][n], q["trainable"][n]) for n in p["trainable"])
        for p, q in zip(wx, wy)
    )

    def steps(d):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in _metrics(str(d)) if r.get("arm") == "ftis"]

    return same and steps(x) == steps(y)


def test_resumed_run_equals_an_uninterrupted_one(two_models, tmp_path, monkeypatch):
    """2 steps then resumed to 3 on the same run directory (as the bench grows a cell) = 3 steps at
    once: the same weights bit for bit, ledgers and per-step metrics. Planted: a resume that
    restarts AdamW's moments instead of loading them gives other weights, and this check says so."""
    from corp.algorithms.grpo.trainer import GRPOTrainer
    from corp.methods.ftis import run_ftis

    a, b = two_models
    run_ftis(_ftis_cfg(a, b, tmp_path / "whole", 3))
    run_ftis(_ftis_cfg(a, b, tmp_path / "grown", 2))
    grown = run_ftis(_ftis_cfg(a, b, tmp_path / "grown", 3))
    assert grown["steps"] == 3 and _same_run(tmp_path / "whole", tmp_path / "grown")

    real = GRPOTrainer.load_checkpoint

    def forgets_the_optimizer(self):
        fresh = self.optimizer.state_dict()
        real(self)
        self.optimizer.load_state_dict(fresh)

    monkeypatch.setattr(GRPOTrainer, "load_checkpoint", forgets_the_optimizer)
    run_ftis(_ftis_cfg(a, b, tmp_path / "broken", 2))
    run_ftis(_ftis_cfg(a, b, tmp_path / "broken", 3))
    assert not _same_run(tmp_path / "whole", tmp_path / "broken")


def test_a_run_trained_past_steps_reports_what_it_holds(two_models, tmp_path):
    """Asked for fewer steps than its checkpoint holds, F-TIS reports the checkpoint's steps, FLOPs and
    model (the bench then trains a run of its own), never the smaller count."""
    from corp.methods.ftis import run_ftis

    a, b = two_models
    three = run_ftis(_ftis_cfg(a, b, tmp_path / "r", 3))
    again = run_ftis(_ftis_cfg(a, b, tmp_path / "r", 2))
    assert again["steps"] == 3 and again["method_flops"] == three["method_flops"]
    row, before = ({r["method"]: r for r in rep["rows"]}["node0-ftis"] for rep in (again, three))
    assert row["step"] == 3 and row["accuracy"] == before["accuracy"]
