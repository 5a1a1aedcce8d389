"""The noise claim's design (configs/noise-claim/smollm2-135m.yaml, results/noise-claim/REGISTRATION.md)
on a tiny model: two CoRP variants, each `from_sigmas` one grid of the bench's `sigmas` (the union of
both), under `hyperparameters: defaults` with `population_rows: true` and registered primaries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corp.bench.budget import prefix_that_fits
from corp.bench.config import BenchConfig
from corp.config import load_config
from corp.runtime.ledger import flops
from corp.runtime.runs import read_jsonl
from tests.test_bench import tiny_options

CALIBRATED = [0.03, 0.06, 0.12]
PAPER = [0.01, 0.02, 0.04]
BUDGET = 8e7


def _specialists(run_dir: Path) -> list[dict]:
    rows = read_jsonl(run_dir / "population.jsonl", key="key", unique=True)
    return sorted((r for r in rows if r.get("kind") == "specialist"), key=lambda r: r["index"])


@pytest.fixture(scope="module")
def claim(tiny_dir, tmp_path_factory):
    from corp.bench.sweep import run_bench

    root = tmp_path_factory.mktemp("noise-claim")
    opts = tiny_options(
        tiny_dir,
        root,
        population=6,
        sigmas=sorted(CALIBRATED + PAPER),  # the union of both grids, as the config gives it
        budgets=[BUDGET],
        seeds=[1, 2],
        settings=["paper"],
        population_rows=True,
        methods={
            "consolidate": {
                # the config's options; alphas kept short and the gate forced open for a tiny model
                "options": {"top_k": [1], "rounds": 0, "noise": "full", "alphas": [1, 2], "gate_z": -10.0},
                "variants": {
                    "corp-calibrated": {"from_sigmas": CALIBRATED},
                    "corp-paper": {"from_sigmas": PAPER},
                },
            }
        },
        primary=[
            "corp-calibrated vs corp-paper @ top on add",
            "corp-calibrated/randopt-top1 vs corp-paper/randopt-top1 @ top on add",
        ],
        test_set="tiny-test",
        compare=[],
    )
    run_bench(load_config(BenchConfig, None, opts))
    out = root / "results" / "tiny"
    recs = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))]
    return {
        "root": root,
        "records": {(r["seed"], r["label"]): r for r in recs},
        "bench": json.loads((out / "bench.json").read_text()),
    }


def test_each_variant_reads_a_population_of_exactly_its_own_grid_scored_once(claim):
    """Claim 1: per seed, one population per variant (none of the union), of its three scales,
    specialist i with scale grid[i % 3] and the same noise seed in both variants."""
    recs, root = claim["records"], claim["root"]
    for seed in (1, 2):
        pops = sorted((root / "work" / "tiny").glob(f"*__population__s{seed}__*"))
        assert len(pops) == 2, pops  # one per variant, scored once; no population of the six scales
        own = {}
        for label, grid in (("corp-calibrated", CALIBRATED), ("corp-paper", PAPER)):
            rec = recs[(seed, label)]
            assert rec["status"] == "done" and rec["population_sigmas"] == grid
            rows = _specialists(Path(rec["population_run"]))
            assert [r["sigma"] for r in rows] == [grid[i % 3] for i in range(len(rows))]
            source = json.loads((Path(rec["run_dir"]) / "report.json").read_text())["population"]["source"]
            assert source["from"] == rec["population_run"] and source["used"] == rec["units"]
            own[label] = rows
        cal, pap = own["corp-calibrated"], own["corp-paper"]
        n = min(len(cal), len(pap))
        assert [r["seed"] for r in cal[:n]] == [r["seed"] for r in pap[:n]]
        assert {p.name for p in pops} == {Path(recs[(seed, lb)]["population_run"]).name for lb in own}


def test_randopt_top1_is_read_on_each_variant_s_own_prefix_and_the_primaries_pair_by_seed(claim):
    """Claim 2: LABEL/randopt-top1 per variant, the best of the cell's own prefix on support, charged
    that prefix; both primaries compared on both seeds on the same test examples."""
    recs = claim["records"]
    for (_, label), rec in recs.items():
        if label not in ("corp-calibrated", "corp-paper"):
            continue
        names = {r["name"]: r for r in rec["rows"]}
        assert set(names) == {label, f"{label}/randopt-top1"}, names
        top1 = names[f"{label}/randopt-top1"]
        assert top1["population_row"] is True
        rows = _specialists(Path(rec["population_run"]))[: rec["units"]]
        report = json.loads((Path(rec["run_dir"]) / "report.json").read_text())
        n_params = report["population"]["selection_ledger"]["n_params"]
        assert top1["flops"] == pytest.approx(
            sum(flops(n_params, r["prompt_tokens"], r["generated_tokens"]) for r in rows)
        )
        (row,) = [r for r in report["rows"] if r["method"] == "randopt-top1"]
        assert (row["seed"], row["sigma"]) in {(r["seed"], r["sigma"]) for r in rows}
        assert row["support_reward"] == max(r["reward"] for r in rows)
    primary = claim["bench"]["primary"]
    assert len(primary) == 2 and all(p["run"] for p in primary), primary
    comps = {(c["a"], c["b"]): c for c in claim["bench"]["comparisons"]}
    for a, b in (
        ("corp-calibrated", "corp-paper"),
        ("corp-calibrated/randopt-top1", "corp-paper/randopt-top1"),
    ):
        assert comps[(a, b)]["seeds"] == [1, 2]


def test_the_budget_takes_a_prefix_of_each_variant_s_population(claim):
    """Claim 3: each cell reads the largest prefix of its own population that fits the budget beside
    its own evaluations (the budget binds here: 3 of 6), the same length in both variants when their
    specialists cost the same."""
    for seed in (1, 2):
        units, costs = {}, {}
        for label in ("corp-calibrated", "corp-paper"):
            rec = claim["records"][(seed, label)]
            report = json.loads((Path(rec["run_dir"]) / "report.json").read_text())
            n_params = report["population"]["selection_ledger"]["n_params"]
            rows = _specialists(Path(rec["population_run"]))
            own = [flops(n_params, r["prompt_tokens"], r["generated_tokens"]) for r in rows]
            assert rec["flops"] <= BUDGET and rec["budget_reached"] is True
            assert rec["flops"] == pytest.approx(sum(own[: rec["units"]]) + rec["own_flops"])
            assert 2 <= rec["units"] == prefix_that_fits(own, BUDGET - rec["own_flops"]) < len(rows)
            units[label], costs[label] = rec["units"], own
        if costs["corp-calibrated"] == costs["corp-paper"]:
            assert units["corp-calibrated"] == units["corp-paper"]
