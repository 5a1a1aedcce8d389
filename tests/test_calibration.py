"""Noise scales chosen from the model (`--sigmas auto`, corp.evaluate.calibration; issue 55): the search
brackets its target on a planted model, its rows are charged, reused on a rerun, skipped under --sigmas,
and a search that never reaches its target uses the bound and says so."""

from __future__ import annotations

import math
import warnings

import pytest

from corp.config import PopulationConfig, load_config
from corp.errors import CorpError
from corp.evaluate.calibration import CALIBRATION_FILE, CALIBRATION_ROWS, RULE, calibration_seeds, grid_of, two_digits
from corp.methods.score import run_score
from corp.runtime.backends.hf import HFBackend
from corp.runtime.runs import read_json, read_jsonl
from tests.conftest import make_char_tokenizer, make_tiny_llama

MID = 3e-3  # the planted model's noise scale at which half of the calibration completions change
N_SUPPORT = 6


def cfg_for(run_dir, **kw) -> PopulationConfig:
    opts = dict(
        task="arith",
        population=3,
        n_support=N_SUPPORT,
        n_probe=0,
        n_validation=0,
        n_test=2,
        max_new_tokens=4,
        seed=0,
        run_dir=str(run_dir),
    )
    return load_config(PopulationConfig, None, {**opts, **kw})


class Planted:
    """The tiny hf backend with its calibration behaviour planted: calibration specialist j's completion on
    prompt i is changed (a character appended) when sigma / (sigma + MID) > u, u = (j * n + i + 0.5) / (m * n):
    the share of changed completions is that probability, quantized, rising in sigma and 0.5 at MID.
    The tiny model's own weights never move (its behaviour under noise is the planted one only); `deaf`: no
    completion ever changes (a calibration that can never reach its target)."""

    def __init__(self, deaf: bool = False):
        tok = make_char_tokenizer()
        self.inner = HFBackend(make_tiny_llama(tok), tok, batch_size=8)
        self.deaf, self.current, self.calls = deaf, None, 0
        self.seeds = calibration_seeds(0, RULE["specialists"])
        real_generate = self.inner.generate

        def set_direction(d):
            self.current = d

        def generate(prompts, *a, **k):
            self.calls += 1
            gens = real_generate(prompts, *a, **k)
            comp = self.current.components[0] if self.current is not None and not deaf else None
            if comp is not None and comp.seed in self.seeds:
                j, n, m = self.seeds.index(comp.seed), len(prompts), len(self.seeds)
                p = comp.sigma / (comp.sigma + MID)
                gens.texts = [t + "#" if p > (j * n + i + 0.5) / (m * n) else t for i, t in enumerate(gens.texts)]
            return gens

        self.inner.set_direction, self.inner.generate = set_direction, generate


def test_search_brackets_the_target_on_a_planted_model_and_grids_around_it(tmp_path):
    report = run_score(cfg_for(tmp_path / "r"), Planted().inner)
    cal = read_json(tmp_path / "r" / CALIBRATION_FILE)
    a, b = cal["bracket"]
    assert (a["sigma"], b["sigma"]) == (2e-3, 4e-3) and a["share"] < 0.5 <= b["share"]
    assert [lv["sigma"] for lv in cal["levels"]] == [1e-3, 2e-3, 4e-3]
    # log-interpolated between the bracketing scales, near the planted midpoint; the grid is around it
    assert 2e-3 < cal["sigma"] < 4e-3 and abs(math.log(cal["sigma"] / MID)) < math.log(1.15)
    assert cal["sigmas"] == [two_digits(cal["sigma"] / 2), cal["sigma"], two_digits(2 * cal["sigma"])]
    rows = read_jsonl(tmp_path / "r" / "population.jsonl", key="key")
    assert sorted({r["sigma"] for r in rows}) == cal["sigmas"]
    assert read_json(tmp_path / "r" / "population_meta.json")["calibrated_sigmas"] == cal["sigmas"]
    assert report["population"]["noise_scales"].startswith(
        f"noise scales calibrated from the model: {', '.join(f'{s:g}' for s in cal['sigmas'])} (share of changed"
    )


def test_calibration_is_charged_to_the_population_and_to_a_run_that_reads_it(tmp_path):
    from corp.evaluate.population import population_summary
    from corp.evaluate.scorer import ensure_population, rows_ledger
    from corp.runtime.context import setup_run

    report = run_score(cfg_for(tmp_path / "a"), Planted().inner)
    cal = read_json(tmp_path / "a" / CALIBRATION_FILE)
    rows = read_jsonl(tmp_path / "a" / CALIBRATION_ROWS, key="key")
    assert len(rows) == 1 + 3 * len(cal["levels"]) and cal["generations"] == len(rows) * N_SUPPORT
    assert cal["ledger"]["generated_tokens"] == sum(r["generated_tokens"] for r in rows) > 0
    pop = read_jsonl(tmp_path / "a" / "population.jsonl", key="key")
    scoring = sum(r["prompt_tokens"] + r["generated_tokens"] for r in pop)
    led = report["population"]["selection_ledger"]
    assert led["prompt_tokens"] + led["generated_tokens"] == scoring + sum(
        r["prompt_tokens"] + r["generated_tokens"] for r in rows
    )
    # a method that takes this population (--from-run) is charged the calibration that chose its scales
    ctx = setup_run(cfg_for(tmp_path / "b", from_run=str(tmp_path / "a")), "randopt", Planted().inner)
    ranked = ensure_population(ctx)
    summary = population_summary(ctx, ranked)
    assert summary["selection_ledger"]["flops"] == pytest.approx(
        rows_ledger(ctx, ranked).flops + cal["ledger"]["flops"]
    )
    assert "calibrated from the model" in summary["noise_scales"] and "--from-run" in summary["noise_scales"]


def test_a_rerun_reuses_the_calibration_rows(tmp_path):
    run_score(cfg_for(tmp_path / "r"), Planted().inner)
    before = read_json(tmp_path / "r" / CALIBRATION_FILE)
    again = Planted()
    run_score(cfg_for(tmp_path / "r"), again.inner)
    assert again.calls == 0, "nothing is generated again: calibration and population rows are reused"
    assert read_json(tmp_path / "r" / CALIBRATION_FILE) == before


def test_a_resumed_population_reads_its_calibration_as_es_does(tmp_path, monkeypatch):
    """One way for both (corp.evaluate.scorer.noise_scales): a run whose meta holds its calibrated grid reads
    calibration.json, without calibrating again; a run without calibration.json calibrates (from cached rows)."""
    import corp.evaluate.scorer as scorer_module

    run_score(cfg_for(tmp_path / "r"), Planted().inner)
    before = read_json(tmp_path / "r" / CALIBRATION_FILE)

    def refuse(*a, **k):
        raise AssertionError("a resumed population calibrated again")

    with monkeypatch.context() as m:
        m.setattr(scorer_module, "calibrate_sigmas", refuse)
        report = run_score(cfg_for(tmp_path / "r"), Planted().inner)
    assert report["population"]["noise_scales"].startswith("noise scales calibrated from the model")
    (tmp_path / "r" / CALIBRATION_FILE).unlink()
    again = Planted()
    run_score(cfg_for(tmp_path / "r"), again.inner)
    assert again.calls == 0 and read_json(tmp_path / "r" / CALIBRATION_FILE) == before


def test_fixed_sigmas_skip_the_calibration(tmp_path):
    planted = Planted()
    report = run_score(cfg_for(tmp_path / "r", sigmas="0.05"), planted.inner)
    assert not (tmp_path / "r" / CALIBRATION_ROWS).exists() and not (tmp_path / "r" / CALIBRATION_FILE).exists()
    assert planted.calls == 3, "the 3 specialists only"
    assert report["population"]["noise_scales"] == "noise scales fixed by --sigmas: 0.05"
    # a run directory scored under fixed scales is not resumed as a calibrated one
    with pytest.raises(CorpError, match="sigmas"):
        run_score(cfg_for(tmp_path / "r"), Planted().inner)


def test_a_calibration_that_never_reaches_its_target_uses_the_bound_and_is_flagged(tmp_path):
    from corp.evaluate.population import sigma_edge_flags
    from corp.evaluate.scorer import ensure_population
    from corp.runtime.context import setup_run

    ctx = setup_run(cfg_for(tmp_path / "r"), "randopt", Planted(deaf=True).inner)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ranked = ensure_population(ctx)
    said = [str(w.message) for w in caught if "calibrat" in str(w.message)]
    assert len(said) == 1 and "\n" not in said[0] and "never reached 0.5 within sigma [1e-05, 0.1]" in said[0]
    cal = ctx.population_source["calibration"]
    assert cal["sigma"] == 0.1 and cal["edge"] == "max" and cal["sigmas"] == grid_of(0.1)
    assert len(cal["levels"]) == RULE["levels"]
    flags = {f["name"]: f for f in sigma_edge_flags(ctx, ranked)}
    assert flags["calibrated sigma"]["edge"] == "max" and flags["calibrated sigma"]["option"] == "--sigmas"


def test_the_top_sigma_edge_flag_reads_the_calibrated_grid(tmp_path):
    from corp.evaluate.population import sigma_edge_flags
    from corp.evaluate.scorer import ensure_population
    from corp.runtime.context import setup_run

    ctx = setup_run(cfg_for(tmp_path / "r"), "randopt", Planted().inner)
    ranked = ensure_population(ctx)
    grid = ctx.population_source["calibration"]["sigmas"]
    top = max(grid)
    ranked = [{**ranked[0], "sigma": top}, *ranked[1:]]
    (flag,) = sigma_edge_flags(ctx, ranked)
    assert flag["name"] == "top-1 sigma" and flag["grid"] == grid and flag["edge"] == "max"


def test_sigmas_auto_is_the_default_and_a_word_other_than_auto_is_refused(tmp_path):
    assert cfg_for(tmp_path).sigmas == "auto" and cfg_for(tmp_path, sigmas="AUTO").sigmas == "auto"
    assert cfg_for(tmp_path, sigmas="1e-3,2e-3").sigmas == [1e-3, 2e-3]
    with pytest.raises(CorpError, match="neither auto nor"):
        cfg_for(tmp_path, sigmas="often")


def test_the_model_card_states_how_the_noise_scales_were_chosen():
    from corp.cards import _edge_lines

    line = "noise scales calibrated from the model: 0.0016, 0.0032, 0.0064 (share ...), cost 60 generations"
    assert _edge_lines({"population": {"noise_scales": line}})[1] == "N" + line[1:] + "."
    assert _edge_lines({"population": {"noise_scales": "noise scales fixed by --sigmas: 0.05"}})[1].startswith(
        "Noise scales fixed by --sigmas"
    )


def test_randopt_states_its_calibrated_scales_in_report_and_table(tmp_path):
    from corp.config import RandOptConfig
    from corp.methods.randopt import run_randopt

    cfg = load_config(RandOptConfig, None, {**vars(cfg_for(tmp_path / "r")), "top_k": "1"})
    report = run_randopt(cfg, Planted().inner)
    line = report["population"]["noise_scales"]
    assert line.startswith("noise scales calibrated from the model") and line in report["table"]
    assert report["population"]["source"]["sigmas"] == read_json(tmp_path / "r" / CALIBRATION_FILE)["sigmas"]


def test_the_bench_and_fedcorp_refuse_auto_in_one_line(tmp_path):
    from corp.bench.config import BenchConfig
    from corp.methods.fedcorp.run import FedCorpConfig

    with pytest.raises(CorpError, match="bench config: sigmas auto is not supported") as e:
        load_config(BenchConfig, None, {"methods": {"randopt": None}, "sigmas": "auto", "results_dir": str(tmp_path)})
    assert "\n" not in str(e.value)
    with pytest.raises(CorpError, match="fedcorp's clients keep to themselves"):
        load_config(FedCorpConfig, None, {"task": "arith", "sigmas": "auto"})
    assert load_config(FedCorpConfig, None, {"task": "arith"}).sigmas == [5e-4, 1e-3, 2e-3]


def test_the_sigma_edge_flag_names_the_python_parameter_in_a_python_call(tmp_path):
    """Inside a Python API call the flag's advice names `sigmas`, not the CLI's `--sigmas` (the README snippet's
    table said 'pass --sigmas' beside 'pass alphas')."""
    from corp.config import python_terms
    from corp.evaluate.population import sigma_edge_flags
    from corp.evaluate.scorer import ensure_population
    from corp.grids import edge_line
    from corp.runtime.context import setup_run

    ctx = setup_run(cfg_for(tmp_path / "r"), "randopt", Planted().inner)
    ranked = ensure_population(ctx)
    ranked = [{**ranked[0], "sigma": max(ctx.population_source["calibration"]["sigmas"])}, *ranked[1:]]
    with python_terms():
        (flag,) = sigma_edge_flags(ctx, ranked)
    assert flag["option"] == "sigmas" and edge_line(flag).endswith("pass sigmas with a larger value")
    (flag,) = sigma_edge_flags(ctx, ranked)
    assert flag["option"] == "--sigmas"
