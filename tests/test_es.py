"""ES: a planted reward rises; resume reproduces the weights bit-exactly; the recipe materialises the model."""

from __future__ import annotations

import pytest
import torch

from corp.algorithms.perturb import SCHEME_VERSION, Direction, Perturber
from corp.config import load_config
from corp.errors import CorpError
from corp.methods.es import ESConfig, fitness, run_es, specialists, update_components
from corp.runtime.backends.hf import HFBackend
from corp.runtime.runs import read_json
from tests.conftest import make_char_tokenizer, make_tiny_llama


def digits(completions, **columns):
    """Planted reward: the fraction of generated characters that are digits."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def tiny_es_cfg(run_dir, **kw):
    base = dict(
        task="arith",
        reward="tests.test_es:digits",
        n_support=6,
        n_probe=0,
        n_validation=0,
        n_test=4,
        max_new_tokens=6,
        iterations=2,
        population=8,
        sigma=0.05,
        alpha=0.05,
        run_dir=str(run_dir),
        batch_size=16,
    )
    base.update(kw)
    return load_config(ESConfig, None, base)


def fresh_backend():
    tok = make_char_tokenizer()
    return HFBackend(make_tiny_llama(tok), tok, batch_size=16)


def test_fitness_shapes():
    z = fitness([0.0, 1.0, 0.5, 0.5], "zscore")
    assert abs(z.mean()) < 1e-12 and abs(z.std() - 1) < 1e-12
    assert list(fitness([0.1, 0.3, 0.2], "rank")) == [-0.5, 0.5, 0.0]
    assert not fitness([0.2, 0.2], "zscore").any()


def test_antithetic_update_is_one_component_per_seed():
    cfg = load_config(ESConfig, None, dict(population=4, antithetic=True, sigma=0.1, alpha=0.2))
    specs = specialists(cfg, 0)
    assert [s for s, _ in specs][::2] == [s for s, _ in specs][1::2] and [g for _, g in specs] == [1, -1, 1, -1]
    comps = update_components(cfg, specs, [1.0, 0.0, 0.0, 0.0])
    f = fitness([1.0, 0.0, 0.0, 0.0], "zscore")
    assert comps[0].seed == specs[0][0] and comps[0].coef == pytest.approx(0.2 * (f[0] - f[1]) / (4 * 0.1))


def test_es_raises_planted_reward_and_recipe_is_exact(tmp_path):
    backend = fresh_backend()
    # alpha 0.01 on 12 support examples: under noise scheme v2 the default step (0.05) overshoots on this
    # tiny model (the centre's reward rises after one iteration, then falls); a smaller step climbs
    report = run_es(tiny_es_cfg(tmp_path / "r", iterations=4, alpha=0.01, n_support=12), backend)
    metrics = report["metrics"]
    print(
        "centre reward per iteration:",
        [m["centre_reward"] for m in metrics],
        "population mean it0:",
        metrics[0]["reward_mean"],
    )
    assert metrics[-1]["centre_reward"] > metrics[0]["reward_mean"] + 0.1, metrics
    recipe = read_json(tmp_path / "r" / "recipe.json")
    assert recipe["noise_scheme"] == SCHEME_VERSION and recipe["components"]
    tok = make_char_tokenizer()
    base = make_tiny_llama(tok)
    Perturber(base).apply(Direction.from_json(recipe["components"]))
    for (n, a), (_, b) in zip(base.state_dict().items(), backend.model.state_dict().items()):
        assert torch.equal(a, b), f"recipe does not materialise {n} bit-exactly"


@pytest.mark.parametrize("workers", [1, 3])
def test_centre_update_on_parallel_workers_has_the_bits_of_add_to(monkeypatch, workers):
    # the centre's update builds tensors on parallel workers: each must get add_to's bits
    import corp.algorithms.perturb.workers as workers_module
    from corp.algorithms.perturb import Component

    monkeypatch.setattr(workers_module, "tensor_workers", lambda numel: workers)
    torch.manual_seed(0)
    pert = Perturber(make_tiny_llama(make_char_tokenizer()))
    w0 = {n: b.clone() for n, b in pert.base.items()}
    comps = [Component(10 + i, 0.02, 0.5 - 0.25 * i) for i in range(12)]
    pert.move_base(comps[:5])  # ES moves the centre one iteration at a time: the bits of one add_to of all
    pert.move_base(comps[5:])
    for name, base in pert.base.items():
        assert torch.equal(base, Direction(comps).add_to(w0[name].clone(), name)), name
    for name, p in pert.params:  # the weights follow the moved base (no direction applied)
        assert torch.equal(p.data, pert.base[name]), name


def test_es_resume_gives_identical_weights(tmp_path):
    full = fresh_backend()
    run_es(tiny_es_cfg(tmp_path / "full"), full)
    run_es(tiny_es_cfg(tmp_path / "cut", iterations=1), fresh_backend())
    resumed = fresh_backend()
    calls = []
    real = resumed.generate
    resumed.generate = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
    run_es(tiny_es_cfg(tmp_path / "cut", iterations=2), resumed)
    assert len(calls) == 8 + 1 + 1, "only iteration 2's specialists, its centre and the final test eval run again"
    for (n, a), (_, b) in zip(full.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), n
    assert (
        read_json(tmp_path / "full" / "recipe.json")["components"]
        == read_json(tmp_path / "cut" / "recipe.json")["components"]
    )


def test_prompts_per_iteration_scores_every_member_on_one_fresh_draw(tmp_path):
    """--prompts-per-iteration K: each iteration's members (and the centre) are scored on the same K
    support examples, drawn afresh per iteration; the ledger charges only those; 0 or K >= the
    split's size is the whole split, with the run's definition unchanged."""
    from corp.runtime.runs import read_jsonl

    report = run_es(tiny_es_cfg(tmp_path / "k2", prompts_per_iteration=2, iterations=3), fresh_backend())
    rows = [r for r in read_jsonl(tmp_path / "k2" / "population.jsonl") if r.get("kind") == "es-specialist"]
    by_iter: dict[int, set] = {}
    for r in rows:
        by_iter.setdefault(r["iteration"], set()).add(tuple(r["example_ids"]))
    assert sorted(by_iter) == [0, 1, 2] and all(len(ids) == 1 for ids in by_iter.values()), by_iter
    draws = [next(iter(ids)) for _, ids in sorted(by_iter.items())]
    assert all(len(d) == 2 for d in draws) and len(set(draws)) > 1, draws  # planted: the draws differ
    whole = run_es(tiny_es_cfg(tmp_path / "all", iterations=3), fresh_backend())
    assert report["training_ledger"]["flops"] < whole["training_ledger"]["flops"] / 2
    assert '"prompts_per_iteration": 2' in (tmp_path / "k2" / "population_meta.json").read_text()
    assert "prompts_per_iteration" not in (tmp_path / "all" / "population_meta.json").read_text()
    run_es(tiny_es_cfg(tmp_path / "k6", prompts_per_iteration=6, iterations=1), fresh_backend())
    k6 = [r for r in read_jsonl(tmp_path / "k6" / "population.jsonl") if r.get("kind") == "es-specialist"]
    assert k6 and all(r["n_examples"] == 6 and "example_ids" not in r for r in k6)


def test_bad_es_options(tmp_path):
    with pytest.raises(CorpError, match="--prompts-per-iteration must be >= 0"):
        tiny_es_cfg(tmp_path, prompts_per_iteration=-1)
    with pytest.raises(CorpError, match="--antithetic"):
        tiny_es_cfg(tmp_path, population=5, antithetic=True)
    with pytest.raises(CorpError, match="--fitness"):
        tiny_es_cfg(tmp_path, fitness="softmax")


def test_corp_es_cli_end_to_end(tmp_path):
    import json

    from typer.testing import CliRunner

    from corp.cli import app

    tok = make_char_tokenizer()
    model_dir = tmp_path / "m"
    make_tiny_llama(tok).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    res = CliRunner().invoke(
        app,
        [
            "es",
            "--model",
            str(model_dir),
            "--task",
            "arith",
            "--iterations",
            "1",
            "--population-per-iteration",
            "4",
            "--antithetic",
            "--fitness",
            "rank",
            "--sigma",
            "0.05",
            "--n-support",
            "3",
            "--n-probe",
            "0",
            "--n-validation",
            "0",
            "--n-test",
            "2",
            "--max-completion-length",
            "4",
            "--output-dir",
            str(tmp_path / "run"),
        ],
    )
    assert res.exit_code == 0, res.output
    recipe = json.loads((tmp_path / "run" / "recipe.json").read_text())
    assert recipe["base_weights_hash"] and recipe["made_by"]["antithetic"] is True
    assert (tmp_path / "run" / "model" / "config.json").exists() and "test accuracy" in res.output


def test_es_calibrates_its_sigma_by_default_charges_it_and_a_fixed_sigma_skips_it(tmp_path):
    """Issue 55: with the default `--sigma auto`, ES runs the population methods' calibration before
    iteration 1 (calibration.json), every member and every recipe component uses sigma* (the scale at
    which half of the calibration completions change), the training ledger holds the calibration's
    generations, and the report, table and card say so; `--sigma 1e-3` calibrates nothing."""
    from corp.cards import _edge_lines
    from corp.evaluate.calibration import CALIBRATION_FILE, CALIBRATION_ROWS
    from corp.runtime.runs import read_jsonl

    run = tmp_path / "auto"
    cfg = tiny_es_cfg(run, sigma=None, iterations=1)  # None: the option left unset (its default)
    assert cfg.sigma == "auto"
    report = run_es(cfg, fresh_backend())
    cal = read_json(run / CALIBRATION_FILE)
    sigma = cal["sigma"]
    assert report["sigma"] == sigma and read_json(run / "population_meta.json")["calibrated_sigma"] == sigma
    members = [r for r in read_jsonl(run / "population.jsonl") if r.get("kind") == "es-specialist"]
    assert len(members) == 8 and {r["sigma"] for r in members} == {sigma}
    recipe = read_json(run / "recipe.json")
    assert recipe["components"] and {c["sigma"] for c in recipe["components"]} == {sigma}
    assert recipe["made_by"]["sigma"] == sigma
    # charged: the training ledger is the ES rows' generations plus the calibration's
    cal_rows = read_jsonl(run / CALIBRATION_ROWS)
    assert cal_rows and cal["ledger"]["generated_tokens"] == sum(r["generated_tokens"] for r in cal_rows) > 0
    es_rows = read_jsonl(run / "population.jsonl")
    led = report["training_ledger"]
    for key in ("prompt_tokens", "generated_tokens"):
        assert led[key] == sum(r[key] for r in es_rows) + cal["ledger"][key], key
    line = report["noise_scales"]
    assert line.startswith(f"noise scale calibrated from the model: {sigma:g}") and "generations" in line
    assert line in report["table"] and "noise-scale calibration" in report["table"]
    assert "--sigmas" not in line and read_json(run / "report.json")["noise_scales"] == line
    assert any(x.startswith("Noise scale calibrated from the model") for x in _edge_lines(report))
    card = (run / "model" / "README.md").read_text()
    assert "Noise scale calibrated from the model" in card

    fixed = tmp_path / "fixed"
    report = run_es(tiny_es_cfg(fixed, sigma="1e-3", iterations=1), fresh_backend())
    assert not (fixed / CALIBRATION_FILE).exists() and not (fixed / CALIBRATION_ROWS).exists()
    assert report["sigma"] == 1e-3 and report["noise_scales"] == "noise scale fixed by --sigma: 0.001"
    assert "calibrated_sigma" not in read_json(fixed / "population_meta.json")
    assert {c["sigma"] for c in read_json(fixed / "recipe.json")["components"]} == {1e-3}
    es_rows = read_jsonl(fixed / "population.jsonl")
    assert report["training_ledger"]["generated_tokens"] == sum(r["generated_tokens"] for r in es_rows)


def test_a_resumed_es_run_reuses_its_calibration_and_keeps_its_sigma(tmp_path, monkeypatch):
    """A resumed `--sigma auto` run reads calibration.json (no calibration, nothing generated for it) and
    keeps its sigma: its weights are those of one uninterrupted run. Resuming it under a fixed --sigma, or
    a fixed-sigma run under auto, is refused in one line."""
    import corp.evaluate.scorer as scorer_module

    full = fresh_backend()
    run_es(tiny_es_cfg(tmp_path / "full", sigma="auto"), full)
    run_es(tiny_es_cfg(tmp_path / "cut", sigma="auto", iterations=1), fresh_backend())

    def refuse(*a, **k):
        raise AssertionError("a resumed run calibrated again")

    monkeypatch.setattr(scorer_module, "calibrate_sigmas", refuse)
    resumed = fresh_backend()
    calls = []
    real = resumed.generate
    resumed.generate = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
    report = run_es(tiny_es_cfg(tmp_path / "cut", sigma="auto", iterations=2), resumed)
    # iteration 2's 8 specialists, and its centre and the final test eval unless the centre did not move (all
    # its members rewarded alike): no calibration row
    assert 8 <= len(calls) <= 8 + 1 + 1, len(calls)
    assert report["sigma"] == read_json(tmp_path / "full" / "calibration.json")["sigma"]
    for (n, a), (_, b) in zip(full.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), n
    with pytest.raises(CorpError, match=r"sigma = auto, not 0\.05"):
        run_es(tiny_es_cfg(tmp_path / "cut", iterations=3), fresh_backend())
    run_es(tiny_es_cfg(tmp_path / "fixed", iterations=1), fresh_backend())
    with pytest.raises(CorpError, match=r"sigma = 0\.05, not auto"):
        run_es(tiny_es_cfg(tmp_path / "fixed", sigma="auto", iterations=2), fresh_backend())


def test_sigma_is_auto_or_a_number_from_flag_yaml_and_python(tmp_path):
    from corp.cli import flags_of, parse_flags

    assert load_config(ESConfig, None, {}).sigma == "auto"
    assert tiny_es_cfg(tmp_path, sigma="AUTO").sigma == "auto"
    assert tiny_es_cfg(tmp_path, sigma="1e-3").sigma == 1e-3 and tiny_es_cfg(tmp_path, sigma=2e-3).sigma == 2e-3
    for given, want in ((["--sigma", "auto"], "auto"), (["--sigma", "1e-3"], 1e-3), ([], "auto")):
        parsed = parse_flags(ESConfig, flags_of(ESConfig), given, "corp es", "")
        assert load_config(ESConfig, None, parsed).sigma == want, given
    with pytest.raises(CorpError, match="--sigma 'often' is neither auto nor a number") as e:
        tiny_es_cfg(tmp_path, sigma="often")
    assert "\n" not in str(e.value)
    with pytest.raises(CorpError, match="--sigma and --learning-rate must be > 0"):
        tiny_es_cfg(tmp_path, sigma="0")
