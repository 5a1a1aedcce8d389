"""benchmarks/size_claim.py (issue 54) on synthetic bench results written in corp's own formats.

Cell records are written as the bench writes them (held to corp.bench.records.CellRecord, then
corp.runtime.runs.write_json into RESULTS/cells/), population rows through corp's row schema
(corp.runtime.context.result_row, appended by append_jsonl) in a copy of the population run under
RESULTS/populations/, as benchmarks/bench_run.sh commits it. Known values are planted so that each
measure is checked exactly.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from benchmark_scripts import load

from corp.algorithms.stats import holm, seed_example_interval
from corp.bench.plan import RECORD_FORMAT
from corp.bench.records import check_record
from corp.runtime.context import EvalResult, eval_identity, result_row, specialist_what
from corp.runtime.runs import append_jsonl, write_json

sc = load("size_claim")

CONTEXT = {"model": "m", "weights_hash": "h", "backend": "hf", "task": {"name": "arith"}, "reward": "correct"}
SUPPORT = [f"s{i}" for i in range(64)]
TEST = [f"t{i}" for i in range(20)]


def _outcomes(k: int, n: int, shift: int = 0) -> list[int]:
    """k correct of n, starting at position `shift` (wrapping): outcomes with a known count."""
    return [int((i - shift) % n < k) for i in range(n)]


def _row(what: str, split: str, ids: list[str], correct: list[int], kind: str, **extra) -> dict:
    res = EvalResult(
        [""] * len(ids), ["0"] * len(ids), [float(c) for c in correct], [bool(c) for c in correct], 1, 1, 0.0
    )
    return result_row(eval_identity(CONTEXT, what, ids), split, res, kind, **extra)


def write_population(out, name, model, params, spec_counts, base_count, sigmas=(0.001, 0.002)):
    """A population run: specialists with the given support correct counts, and the base's support row
    (`base_count` None: none, as corp score writes it today)."""
    pop = out / "populations" / name
    pop.mkdir(parents=True)
    for i, k in enumerate(spec_counts):
        seed, sigma = 1000 + i, sigmas[i % len(sigmas)]
        row = _row(specialist_what(seed, sigma), "support", SUPPORT, _outcomes(k, 64, i), "specialist", seed=seed)
        append_jsonl(pop / "population.jsonl", {**row, "sigma": sigma, "index": i})
    if base_count is not None:
        append_jsonl(pop / "evals.jsonl", _row("base", "support", SUPPORT, _outcomes(base_count, 64), "base"))
    write_json(pop / "population_meta.json", {"format": 2, "kind": "population", "model_name": model})
    write_json(pop / "report.json", {"population": {"selection_ledger": {"n_params": params}}})
    return f"runs/bench/x/{name}"  # where the bench ran it (git-ignored): the script finds the committed copy


def _cell_row(name: str, report_row: str, correct: list[int], **extra) -> dict:
    acc = sum(correct) / len(correct)
    return {
        "name": name,
        "report_row": report_row,
        "accuracy": acc,
        "passes_per_example": 1,
        "labelled_examples": 64,
        "test_tokens": 100,
        "test_flops": 1.0,
        "correct": correct,
        **extra,
    }


def write_cell(out, seed, method, label, rows, budget=1e13, **extra):
    rec = {
        "format": RECORD_FORMAT,
        "bench_protocol": 2,
        "task": "arith",
        "setting": "equal-data",
        "seed": seed,
        "method": method,
        "label": label,
        "budget": budget,
        "kind": "fixed" if budget is None else "population",
        "status": "done",
        "rows": rows,
        "example_ids": TEST,
        "flops": 0.0,
        "units": 8,
        "wall_seconds": 1.0,
        **extra,
    }
    check_record(rec)
    (out / "cells").mkdir(parents=True, exist_ok=True)
    write_json(out / "cells" / f"arith__equal-data__s{seed}__{label}__{budget}.json", rec)


def write_seed(out, seed, model, params, base, top1, corp, vote=None, spec_counts=(), base_support=10, abstained=False):
    """One seed: the base's cell, a CoRP cell carrying RandOpt's rows on its population, and its population.
    `base`, `top1`, `corp`, `vote`: correct counts of 20 test examples."""
    pop = write_population(out, f"pop-s{seed}", model, params, spec_counts, base_support)
    write_cell(
        out, seed, "self-consistency", "self-consistency", [_cell_row("base", "base", _outcomes(base, 20))], None
    )
    rows = [_cell_row("corp", "corp (abstained=base)" if abstained else "corp", _outcomes(corp, 20, 3))]
    rows.append(_cell_row("corp/randopt-top1", "randopt-top1", _outcomes(top1, 20, 1), population_row=True))
    if vote is not None:
        rows.append(_cell_row("corp/randopt-vote@8", "randopt-vote@8", _outcomes(vote, 20, 2), population_row=True))
    write_cell(out, seed, "consolidate", "corp", rows, population_run=pop)


def test_density_counts_a_specialist_only_at_the_margin_or_above(tmp_path):
    """Base 10 of 64 on support, margin 4: 14, 15 and 30 count; 13 (one short of the margin) does not: 3 of 8."""
    write_seed(tmp_path, 0, "m", 1e8, 2, 4, 5, spec_counts=[14, 13, 15, 10, 2, 30, 12, 9], base_support=10)
    m = sc.model_summary([tmp_path], margin=4, corp_label=None, vote_k=8)
    d = m["seeds"][0]["density"]
    assert (d["value"], d["beats"], d["n"], d["base_support_correct"]) == (0.375, 3, 8, 10)
    # specialists alternate sigma 0.001 (counts 14, 15, 2, 12) and 0.002 (13, 10, 30, 9)
    assert d["by_sigma"] == {"0.001": {"beats": 2, "n": 4}, "0.002": {"beats": 1, "n": 4}}
    assert sc.model_summary([tmp_path], margin=5, corp_label=None, vote_k=8)["seeds"][0]["density"]["value"] == 2 / 8
    # --seeds: a seed another study ran on the same config is not read
    write_seed(tmp_path, 5, "m", 1e8, 2, 4, 5, spec_counts=[30] * 8, base_support=10)
    assert [x["seed"] for x in sc.model_summary([tmp_path], 4, None, 8)["seeds"]] == [0, 5]
    assert [x["seed"] for x in sc.model_summary([tmp_path], 4, None, 8, only={0, 1, 2, 3, 4})["seeds"]] == [0]


def test_a_seed_with_only_its_base_cell_is_not_counted_as_a_seed_with_measures(tmp_path):
    """Planted (the S run, 2026-12-07: seed 3's base cell had finished, its CoRP cell not): the table said
    4 seeds over measures of 3; it says 1 (+1 unfinished) here."""
    write_seed(tmp_path, 0, "m", 1e8, 2, 4, 5, spec_counts=[14, 13], base_support=10)
    write_cell(tmp_path, 1, "self-consistency", "self-consistency", [_cell_row("base", "base", _outcomes(2, 20))], None)
    m = sc.model_summary([tmp_path], 4, None, 8)
    text = sc.markdown({"margin": 4, "vote_k": 8, "models": [m], "primaries": sc.primaries([m])})
    assert "| m | 1e+08 | 1 (+1 unfinished) |" in text, text
    assert "Missing: m seed 1: no population run found" in text, text  # the seed, not the whole model


def test_density_is_missing_without_the_base_support_row(tmp_path):
    """A population scored without --score-base has no base support row: the density says which row is missing, no number."""
    write_seed(tmp_path, 0, "m", 1e8, 2, 4, 5, spec_counts=[14, 13], base_support=None)
    d = sc.model_summary([tmp_path], 4, None, 8)["seeds"][0]["density"]
    assert d["value"] is None and "no base row on the support split" in d["missing"]


def test_gains_use_corps_own_population_rows_and_an_abstention_counts_zero(tmp_path):
    """Seed 0: top-1 (on CoRP's population) 7 vs base 4 of 20 -> +0.15, vote 6 -> +0.10, CoRP 9 -> +0.25.
    Seed 1: the gate kept the base; its row (10 correct here) is the base's model, so its gain is 0.
    A randopt cell's own top-1 row (20 of 20) must not replace the one on CoRP's population."""
    write_seed(tmp_path, 0, "m", 1e8, base=4, top1=7, corp=9, vote=6, spec_counts=[14])
    write_seed(tmp_path, 1, "m", 1e8, base=4, top1=5, corp=10, vote=6, spec_counts=[14], abstained=True)
    write_cell(tmp_path, 0, "randopt", "randopt", [_cell_row("randopt-top1", "randopt-top1", [1] * 20)])
    m = sc.model_summary([tmp_path], 4, None, 8)
    s0, s1 = m["seeds"]
    assert s0["gain"] == pytest.approx({"top1": 0.15, "corp": 0.25, "vote": 0.10})
    assert s1["abstained"] and s1["gain"]["corp"] == 0.0 and s1["gain"]["top1"] == pytest.approx(0.05)
    assert m["corp_gain"]["mean"] == pytest.approx(0.125)
    assert m["top1_gain"]["mean"] == pytest.approx(0.10)
    # across seeds on shared test examples: corp's own crossed interval
    base = _outcomes(4, 20)
    want = seed_example_interval([_outcomes(9, 20, 3), base], [base, base])
    assert m["corp_gain"]["ci"] == pytest.approx(list(want["ci"]))


def test_primaries_are_welch_differences_and_holm_adjusted(tmp_path):
    """Small model: densities 1/4, 2/4, 1/4; large: 3/4, 4/4, 2/4 -> density(L) - density(S) = 3/4 - 1/3; its se
    combines the two t-over-seeds standard errors; the three p-values are Holm-adjusted together."""
    small, large = tmp_path / "small", tmp_path / "large"
    for seed, (ks, kl) in enumerate([(1, 3), (2, 4), (1, 2)]):
        write_seed(small, seed, "s", 1e8, 4, 5, 6 + seed, spec_counts=[20] * ks + [0] * (4 - ks))
        write_seed(large, seed, "l", 2e9, 4, 6, 9 + 2 * seed, spec_counts=[20] * kl + [0] * (4 - kl))
    out = tmp_path / "out"
    result = sc.main(["--model", str(large), "--model", str(small), "--out", str(out)])
    p = result["primaries"]
    assert (p[0]["L"], p[0]["S"]) == ("l", "s")
    assert p[0]["mean"] == pytest.approx(0.75 - 1 / 3)
    se_s, se_l = math.sqrt(1 / 48 / 3), math.sqrt(1 / 16 / 3)  # sample sd^2 / k: 1/48 and 1/16 over 3 seeds
    assert p[0]["se"] == pytest.approx(math.hypot(se_s, se_l))
    large_m = next(m for m in result["models"] if m["model"] == "l")
    assert p[2]["mean"] == pytest.approx(large_m["corp_gain"]["mean"])
    assert [x["p_holm"] for x in p] == pytest.approx([h["p_holm"] for h in holm([x["p"] for x in p])])
    assert all(x["p"] is not None for x in p)
    text = (out / "size_claim.md").read_text()
    assert "density(L) - density(S)" in text and (out / "size_claim.json").exists()
    pytest.importorskip("matplotlib")
    assert result["plot"] == "size_claim.png" and (out / "size_claim.png").stat().st_size > 0


def test_no_runs_says_no_result_yet(tmp_path):
    result = sc.main(["--model", str(tmp_path / "qwen"), "--out", str(tmp_path / "out")])
    assert result["models"][0]["status"] == sc.NO_RESULT
    assert all(x["p_holm"] is None and not x["reject"] for x in result["primaries"])
    assert "No result yet" in (tmp_path / "out" / "size_claim.md").read_text()


def test_score_base_writes_the_base_support_row_the_density_reads(tiny_dir, tmp_path):
    """`corp score --score-base` on a tiny model: the base's support row lands in evals.jsonl under the
    specialists' support ids, so the script's density finds it, and the report's counts are the ones
    recomputed from the rows. Without the option the density is missing (the planted case)."""
    from corp.config import load_config
    from corp.methods import REGISTRY
    from corp.runtime.runs import read_jsonl

    m = REGISTRY["score"]
    common = {**m.smoke, "task": "arith", "reward": "tests.test_methods:text_checksum", "seed": 1}
    common |= {"population": 6, "model": str(tiny_dir)}
    runs = {}
    for on in (False, True):
        runs[on] = tmp_path / f"score-base-{on}"
        report = m(load_config(m.config, None, {**common, "score_base": on, "run_dir": str(runs[on])}))
    assert sc.density(*sc.support_rows(runs[False]), 4)["value"] is None
    specs, base = sc.support_rows(runs[True])
    assert base is not None and len(specs) == 6
    got = report["population"]["source"]["base_support"]
    assert got["reward"] == base["reward"] and got["correct"] == sum(base["correct"])
    assert got["above"] == sum(r["reward"] > base["reward"] for r in specs)
    for margin in (1, 4):
        assert got["above_by"][str(margin)] == sc.density(specs, base, margin)["beats"]
    # the pass is the only row evals.jsonl holds, and it is not a population row
    assert [r["what"] for r in read_jsonl(runs[True] / "evals.jsonl", key="key")] == ["base"]
    assert got["generated_tokens"] == base["generated_tokens"]
    assert "base on support:" in m.summary(report)


def test_amendment_3_reads_model_m_with_its_own_length_and_extraction_and_keeps_s_and_l_runs(monkeypatch):
    """M (results/size-claim/AMENDMENT-3.md): 24 new tokens and arith's extract=equation, in run directories
    of their own; S and L (the registered 16 tokens, default extraction) keep their specs and directories."""
    choose = load("size_claim_choose")
    assert choose.spec("digits=2,ops=+") == "arith:digits=2,ops=+,pool=7600,heldout=6000,dev=400,select=4000"
    assert choose.spec("digits=2,ops=+", choose.POOL, "equation").endswith(",select=4000,extract=equation")
    assert choose.suffix(16) == "" and choose.suffix(24, "equation") == "-len24-equation"
    assert choose.engine(24)[-2:] == ["--max-completion-length", "24"]
    seen = []

    def corp(python, *args):
        seen.append(args)
        return {"test": [{"accuracy": 0.3, "n": 400}]}

    monkeypatch.setattr(choose, "corp", corp)
    got = choose.choose_level("py", "gemma3-270m", tmp := Path("/nonexistent"), "1", 24, "equation")
    assert got["level"] == choose.LADDER[0] and seen[0][seen[0].index("--task") + 1].endswith(
        "dev=400,extract=equation"
    )
    assert str(tmp) in seen[0][seen[0].index("--output-dir") + 1] and seen[0][-1].endswith("-len24-equation")


def test_the_plot_names_no_paper_size_on_top_of_ours():
    """The 1.5B model (1.78e9 parameters with its untied output matrix) and the paper's Qwen2.5-1.5B (1.5e9)
    were two tick labels printed over each other ("1.5B1.8B"); the paper's tick goes where one of ours is near."""
    ticks = sc.tick_sizes([1.35e8, 1.777e9], [x for x, _ in sc.PAPER_DENSITY])
    assert [sc.size_name(x) for x in ticks] == ["135M", "500M", "1.8B", "3B"]
