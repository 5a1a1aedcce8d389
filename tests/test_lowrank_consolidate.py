"""Low-rank consolidation (ours) and LoRA export: the direction is exact, its cache key is its own,
the pipeline's recipe rebuilds the low-rank model bit-exactly, the PEFT adapter reproduces it, and
`auto` takes r* from analyze-rank (r* = 0 and unanalysed parameters stay at W0)."""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from corp.algorithms.lowrank import FACTORS_FILE, LowRankDirection
from corp.algorithms.perturb import Component, Direction, Perturber
from corp.config import load_config
from corp.errors import CorpError
from corp.methods.consolidate.config import ConsolidateConfig
from corp.methods.consolidate.lowrank import LowRankProjector, resolve_ranks
from corp.methods.consolidate.run import direction_fingerprint
from tests.conftest import REPO, make_char_tokenizer, make_tiny_llama, tiny_consolidate_config

Q0 = "model.layers.0.self_attn.q_proj.weight"
O1 = "model.layers.1.self_attn.o_proj.weight"
UP0 = "model.layers.0.mlp.up_proj.weight"
K0 = "model.layers.0.self_attn.k_proj.weight"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    tok = make_char_tokenizer()
    model = make_tiny_llama(tok, hidden=64)
    d = tmp_path_factory.mktemp("tiny64")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d, tok


def text_checksum(completions, **_):
    """A reward that moves whenever the output text moves (the 64-wide tiny model rarely writes '7')."""
    return [(sum(map(ord, c)) % 97) / 96 for c in completions]


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).eval()


def _cfg(model_dir, run, **kw):
    fields = dict(
        reward="tests.test_lowrank_consolidate:text_checksum",
        max_new_tokens=6,
        alphas="2,4",
        gate_z=-10.0,  # force acceptance unless the candidate IS the base: this is about what gets saved
    )
    return tiny_consolidate_config(model_dir, run, **{**fields, **kw})


def test_lowrank_direction_is_exact_and_fingerprinted_apart():
    tok = make_char_tokenizer()
    model = make_tiny_llama(tok, hidden=64)
    W0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    g = torch.Generator().manual_seed(0)
    factors = {
        Q0: (torch.randn(64, 2, generator=g), torch.randn(2, 64, generator=g)),
        "lm_head.weight": (torch.randn(len(tok), 3, generator=g), torch.randn(3, 64, generator=g)),
    }
    source = [Component(11, 0.01, 1.0)]
    d = LowRankDirection(factors, 0.7, source)
    pert = Perturber(model)
    pert.apply(d)
    for n, p in model.named_parameters():
        if n in factors:
            B, A = factors[n]
            assert torch.allclose(p, W0[n] + 0.7 * B @ A, atol=1e-6, rtol=0)
            assert torch.equal(p, W0[n] + (0.7 * (B.double() @ A.double())).float())
            assert not torch.equal(p, W0[n])
        else:
            assert torch.equal(p, W0[n]), n
    pert.restore()
    assert all(torch.equal(p, W0[n]) for n, p in model.named_parameters())
    # a low-rank direction is never used as a seed-component prefix (same components, other weights)
    pert.cache_prefix(d)
    pert.apply(Direction(source))
    prefixed = {n: p.detach().clone() for n, p in model.named_parameters()}
    pert.cache_prefix(None)
    pert.apply(Direction(source))
    assert all(torch.equal(p, prefixed[n]) for n, p in model.named_parameters())

    full = Direction(source)
    assert direction_fingerprint(d) != direction_fingerprint(full)
    assert direction_fingerprint(d.scaled(2.0)) not in (
        direction_fingerprint(d),
        direction_fingerprint(full.scaled(2.0)),
    )
    assert direction_fingerprint(LowRankDirection({}, 1.0, source)) == "base", "no factors: the base, evaluated once"
    with pytest.raises(CorpError, match="cannot be added"):
        Direction() + d
    with pytest.raises(CorpError, match="cannot be added"):
        d + full

    # the projector: B @ A is the best rank-r approximation of m's block; P(alpha m) = alpha P(m)
    from corp.algorithms.lowrank import project_low_rank

    params = [(n, p.shape) for n, p in model.named_parameters()]
    m = Direction([Component(3, 0.02, 0.6), Component(4, 0.02, 0.4)])
    proj = LowRankProjector({Q0: 2, K0: 0}, params)(m)
    assert set(proj.factors) == {Q0} and proj.ranks == {Q0: 2}
    B, A = proj.factors[Q0]
    assert torch.allclose(B @ A, project_low_rank(m.delta(Q0, (64, 64)), 2), atol=1e-6)
    assert torch.allclose(proj.scaled(3.0).delta(Q0, (64, 64)), 3.0 * (B @ A), atol=1e-5)
    assert torch.equal(proj.delta(K0, (32, 64)), torch.zeros(32, 64)), "rank 0: no update"


@pytest.mark.slow
def test_pipeline_rank2_recipe_rebuilds_bit_exactly_and_peft_adapter_matches(tiny_dir, tmp_path):
    import peft
    from safetensors.torch import load_file

    from corp.methods.consolidate.run import run_consolidate

    model_dir, tok = tiny_dir
    run = tmp_path / "run"
    report = run_consolidate(_cfg(model_dir, run, low_rank="2", export_lora=True))
    corp = report["corp"]
    assert corp["accepted"], corp["reason"]
    lr = corp["low_rank"]
    base = _load(model_dir)
    n2d = sum(1 for _, p in base.named_parameters() if p.dim() == 2)
    assert lr["mode"] == "2" and lr["matrices_with_rank"] == n2d and set(lr["ranks"].values()) == {2}
    assert (
        lr["lora_parameters"]
        == sum(2 * sum(p.shape) for _, p in base.named_parameters() if p.dim() == 2)
        < lr["full_parameters"]
    )
    assert "low-rank: 2" in report["table"] and "PEFT adapter" in report["table"]
    assert all("alpha=" in row["candidate"] for row in corp["probe_table"][1:])

    recipe = json.loads((run / "recipe.json").read_text())
    assert (
        recipe["components"] == []
        and recipe["low_rank"]["factors_file"] == FACTORS_FILE
        and recipe["low_rank"]["projected_from"]
    )
    scale = recipe["low_rank"]["scale"]
    assert scale in (2.0, 4.0)

    saved = load_file(run / "model" / "model.safetensors")
    factors = load_file(run / FACTORS_FILE)
    for n, p in base.named_parameters():
        if p.dim() == 2:
            B, A = factors[f"{n}.B"], factors[f"{n}.A"]
            assert B.shape[1] == 2 and torch.equal(
                saved[n], p.detach() + (scale * (B.double() @ A.double())).float()
            ), n
            assert torch.linalg.matrix_rank(saved[n] - p.detach(), rtol=1e-4) <= 2  # up to fp32 rounding of W0 + delta
        else:
            assert torch.equal(saved[n], p.detach()), f"1-D {n} must stay at W0"

    env = {**os.environ, "CORP_NO_PROGRESS": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "corp.cli", "apply", str(run / "recipe.json"), "--out", str(tmp_path / "applied")],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    applied = load_file(tmp_path / "applied" / "model.safetensors")
    assert saved.keys() == applied.keys() and all(torch.equal(saved[k], applied[k]) for k in saved)

    # the PEFT adapter on the base gives the merged low-rank model's logits
    cfg = json.loads((run / "lora" / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 2
    lora = peft.PeftModel.from_pretrained(_load(model_dir), run / "lora").eval()
    merged = _load(run / "model")
    ids = tok("What is 12 + 7? 777", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want, got, base_logits = merged(ids).logits, lora(input_ids=ids).logits, base(ids).logits
    assert (want - base_logits).abs().max() > 1e-3, "the update must matter for this check to mean anything"
    assert torch.allclose(got, want, atol=1e-5, rtol=0), float((got - want).abs().max())
    # ... and PEFT alone, in a fresh interpreter, finds the base from the adapter (the base it was trained on)
    assert Path(cfg["base_model_name_or_path"]).resolve() == Path(model_dir).resolve()
    code = (
        "import sys, torch\nfrom peft import AutoPeftModelForCausalLM\nfrom transformers import AutoModelForCausalLM\n"
        "ids = torch.tensor([[5, 6, 7, 8, 9]])\n"
        "lora = AutoPeftModelForCausalLM.from_pretrained(sys.argv[1]).eval()\n"
        "merged = AutoModelForCausalLM.from_pretrained(sys.argv[2]).eval()\n"
        "with torch.no_grad():\n    d = (lora(input_ids=ids).logits - merged(ids).logits).abs().max().item()\n"
        "assert not any(k == 'corp' or k.startswith('corp.') for k in sys.modules)\nprint('maxdiff', d)\n"
    )
    plain = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [sys.executable, "-c", code, str(run / "lora"), str(run / "model")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=plain,
    )
    assert res.returncode == 0 and float(res.stdout.split()[-1]) < 1e-5, res.stderr[-2000:]

    # a tampered or missing factors file is a one-line error
    (run / FACTORS_FILE).write_bytes((run / FACTORS_FILE).read_bytes()[:-4] + b"\0\0\0\0")
    res = subprocess.run(
        [sys.executable, "-m", "corp.cli", "apply", str(run / "recipe.json"), "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert res.returncode == 2 and res.stderr.count("error:") == 1 and "sha256" in res.stderr, res.stderr
    (run / FACTORS_FILE).unlink()
    from corp.algorithms.recipe import apply_recipe

    with pytest.raises(CorpError, match="missing"):
        apply_recipe(run / "recipe.json", tmp_path / "y")


@pytest.mark.slow
def test_auto_takes_r_star_from_analyze_rank_and_rank_zero_stays_at_w0(tiny_dir, tmp_path):
    import peft
    from safetensors.torch import load_file

    from corp.algorithms.lowrank import reproducible_ranks
    from corp.methods.analyze_rank.config import AnalyzeRankConfig
    from corp.methods.analyze_rank.split_half import run_analyze_rank
    from corp.methods.consolidate.run import run_consolidate

    model_dir, tok = tiny_dir
    base = _load(model_dir)
    W0 = {n: p.detach() for n, p in base.named_parameters()}

    # 1) the lead's flow: a full-rank consolidate scores the population, a real (tiny) analyze-rank
    #    writes r* into that run, and `--low-rank auto --population-from` reads r* from there
    pop = tmp_path / "pop"
    sig = {"sigmas": "0.1", "alphas": "4,8"}  # few matrices get a rank below: bigger steps so the outputs move
    run_consolidate(_cfg(model_dir, pop, **sig))
    run_analyze_rank(load_config(AnalyzeRankConfig, None, dict(run=str(pop), ranks="1,2", splits=2, permutations=19)))
    r_star = reproducible_ranks(pop)
    report = run_consolidate(_cfg(model_dir, tmp_path / "run_real", low_rank="auto", population_from=str(pop), **sig))
    lr = report["corp"]["low_rank"]
    assert lr["mode"] == "auto" and lr["rank_from"] == str(pop) and lr["ranks"] == dict(sorted(r_star.items()))
    assert "model.embed_tokens.weight" not in lr["ranks"], "analyze-rank skips vocabulary matrices by default"
    saved = load_file(tmp_path / "run_real" / "model" / "model.safetensors")
    for n, w in W0.items():
        if r_star.get(n, 0) == 0:
            assert torch.equal(saved[n], w), f"{n} (r* = {r_star.get(n, 'not analysed')}) must stay at W0"

    # 2) a hand-written rank_summary.json with mixed ranks (--rank-from), exported with per-module ranks
    hand = tmp_path / "hand"
    hand.mkdir()
    ranks = {n: 0 for n in r_star}
    ranks.update({Q0: 2, O1: 1, UP0: 3})
    (hand / "rank_summary.json").write_text(json.dumps({"r_star": ranks}))
    run = tmp_path / "run_hand"
    report = run_consolidate(
        _cfg(model_dir, run, low_rank="auto", population_from=str(pop), rank_from=str(hand), export_lora=True, **sig)
    )
    assert report["corp"]["accepted"], report["corp"]["reason"]
    lr = report["corp"]["low_rank"]
    assert lr["matrices_with_rank"] == 3 and lr["lora_parameters"] == 2 * (64 + 64) + 1 * (64 + 64) + 3 * (128 + 64)
    assert "3 of" in report["table"]
    saved = load_file(run / "model" / "model.safetensors")
    changed = {n for n, w in W0.items() if not torch.equal(saved[n], w)}
    assert changed == {Q0, O1, UP0}, changed
    for n, r in ((Q0, 2), (O1, 1), (UP0, 3)):
        assert torch.linalg.matrix_rank(saved[n] - W0[n], rtol=1e-4) == r
    recipe = json.loads((run / "recipe.json").read_text())
    assert recipe["low_rank"]["ranks"] == {O1: 1, Q0: 2, UP0: 3} and recipe["low_rank"]["rank_from"] == str(hand)
    cfg = json.loads((run / "lora" / "adapter_config.json").read_text())
    assert cfg["r"] == 3 and cfg["rank_pattern"] == {Q0[:-7]: 2, O1[:-7]: 1, UP0[:-7]: 3}
    lora = peft.PeftModel.from_pretrained(_load(model_dir), run / "lora").eval()
    ids = tok("What is 3 + 4?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.allclose(lora(input_ids=ids).logits, _load(run / "model")(ids).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"low_rank": "0"}, "--low-rank rank must be >= 1"),
        ({"low_rank": "full"}, "--low-rank must be 'off', 'auto' or a positive integer"),
        ({"low_rank": "2", "rounds": 1}, "cannot be combined with --stage2-rounds"),
        ({"export_lora": True}, "--export-lora needs a low-rank update"),
        ({"export_lora": True, "noise": "full"}, "or score a low-rank population (--noise lowrank:r=R)"),
        ({"export_lora": True, "noise": "lowrank:r=2", "lora_rank": -1}, "--lora-r must be >= 1"),
        ({"noise": "lowrank:r=2", "lora_rank": 2}, "--lora-r compresses the exact adapter"),
        ({"export_lora": True, "low_rank": "2", "noise": "lowrank:r=2", "lora_rank": 2}, "--lora-r compresses"),
        ({"export_lora": True, "noise": "lowrank:r=0"}, "r=0"),
        ({"low_rank": "2", "rank_from": "/tmp"}, "--rank-from only applies to --low-rank auto"),
        ({"low_rank": "auto", "rank_from": "/nonexistent-ranks"}, "is not a directory"),
    ],
)
def test_bad_low_rank_options_are_one_line_errors(overrides, message):
    with pytest.raises(CorpError, match=message.replace("(", r"\(").replace(")", r"\)")) as exc:
        load_config(ConsolidateConfig, None, overrides)
    assert "\n" not in str(exc.value)


@pytest.mark.slow
def test_auto_without_analysis_tells_the_user_to_run_analyze_rank(tiny_dir, tmp_path):
    model_dir, _ = tiny_dir
    env = {**os.environ, "CORP_NO_PROGRESS": "1"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "corp.cli",
            "consolidate",
            "--model",
            str(model_dir),
            "--task",
            "arith",
            "--population",
            "4",
            "--top-k",
            "1",
            "--low-rank",
            "auto",
            "--output-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert res.returncode == 2 and len(err) == 1 and "run `corp analyze-rank --" in err[0], res.stderr
    assert not (tmp_path / "run" / "population.jsonl").exists(), "the error comes before any scoring"
    with pytest.raises(CorpError, match="covers none"):
        resolve_ranks("auto", [("x.weight", (4, 4))], {"y.weight": 2}, "somewhere")


def _adapter_gap(model_dir, adapter_dir, merged, prompts):
    """(max |logit diff|, greedy answers agree on every prompt) of base + adapter (plain PEFT) vs `merged`."""
    import peft

    lora = peft.PeftModel.from_pretrained(_load(model_dir), adapter_dir).eval()
    gap, same = 0.0, True
    with torch.no_grad():
        for ids in prompts:
            gap = max(gap, float((lora(input_ids=ids).logits - merged(ids).logits).abs().max()))
            kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
            same &= torch.equal(lora.generate(input_ids=ids, **kw), merged.generate(ids, **kw))
    return gap, same


def test_lowrank_population_exports_corp_exactly_as_lora(tiny_dir, tmp_path):
    """--noise lowrank:r=2 --export-lora (no --low-rank): the adapter is CoRP's update with no
    truncation (rank <= K*r), base + adapter through plain PEFT gives the saved merged model's
    logits (within 5e-5) and greedy answers; a wrong scale or a dropped elite does not; the
    rank-3 SVD adapter's stated error is the dense update's."""
    from safetensors.torch import load_file

    from corp.methods.consolidate.lowrank import compress, exact_lora
    from corp.methods.consolidate.run import run_consolidate

    model_dir, tok = tiny_dir
    run = tmp_path / "run"
    R2 = "corp-lowrank-v1:r=2"
    report = run_consolidate(_cfg(model_dir, run, noise="lowrank:r=2", export_lora=True, lora_rank=3))
    corp = report["corp"]
    assert corp["accepted"], corp["reason"]
    ex = corp["low_rank"]["exact_lora"]
    recipe = json.loads((run / "recipe.json").read_text())
    assert recipe["noise_scheme"] == R2 and recipe["components"], "the saved model is the seeded (dense reference) one"
    direction = Direction.from_json(recipe["components"])
    K = len({c.seed for c in direction.seed_components()})
    assert K >= 2, "needs two elites for a dropped one to be a test"
    base = _load(model_dir)
    mats = {n: p for n, p in base.named_parameters() if p.dim() == 2}
    assert ex["elites"] == K and ex["max_rank"] == K * 2 and ex["matrices"] == len(mats)
    assert "exact LoRA" in report["table"] and "relative Frobenius error" in report["table"]

    cfg = json.loads((run / "lora" / "adapter_config.json").read_text())
    tensors = load_file(run / "lora" / "adapter_model.safetensors")
    assert cfg["rank_pattern"] and max(cfg["rank_pattern"].values()) <= K * 2
    for key, t in tensors.items():
        assert min(t.shape) <= K * 2, key

    # 1-D parameters stay at W0 in the saved model, so the update is exactly the adapter's matrices
    saved = load_file(run / "model" / "model.safetensors")
    assert all(torch.equal(saved[n], p.detach()) for n, p in base.named_parameters() if p.dim() == 1)
    merged = _load(run / "model")
    prompts = [tok(t, return_tensors="pt")["input_ids"] for t in ("What is 12 + 7? ", "3 + 4 = ", "99-1")]
    with torch.no_grad():
        moved = max(float((merged(ids).logits - base(ids).logits).abs().max()) for ids in prompts)
    assert moved > 1e-3, "the update must matter"
    # tolerance: the saved weights round W0 + dense E to fp32 once, PEFT adds x A^T B^T in fp32 on
    # top of x W0^T; measured 8.8e-6 on logits of size ~1, a wrong scale or lost elite moves them > 1e-3
    gap, same = _adapter_gap(model_dir, run / "lora", merged, prompts)
    assert gap < 5e-5 and same, gap

    # planted bugs: a wrong scale, a dropped elite
    params = [(n, p.shape) for n, p in base.named_parameters()]
    exact = exact_lora(direction, params, R2)
    from corp.methods.consolidate.lowrank import export_lora

    dropped = exact_lora(Direction(direction.seed_components()[:-1]), params, R2)
    for label, bad in [("scale", exact.scaled(1.1)), ("dropped elite", dropped)]:
        export_lora(bad, base, tmp_path / label)
        bad_gap, _ = _adapter_gap(model_dir, tmp_path / label, merged, prompts)
        assert bad_gap > 1e-3, (label, bad_gap)

    # the factored update equals the dense reference per matrix; the compressed adapter's error is the SVD's
    tail = total = 0.0
    for n, p in mats.items():
        dense = direction.delta(n, p.shape, scheme=R2).double()
        B, A = exact.factors[n]
        assert torch.allclose(B.double() @ A.double(), dense, atol=1e-6, rtol=0), n
        S = torch.linalg.svdvals(dense)
        tail, total = tail + float((S[3:] ** 2).sum()), total + float((S**2).sum())
    comp = ex["compressed"]
    assert comp["rank"] == 3 and 0 < comp["relative_frobenius_error"] < 1
    assert abs(comp["relative_frobenius_error"] - (tail / total) ** 0.5) < 1e-4
    assert compress(exact, 3)[1]["relative_frobenius_error"] == pytest.approx(comp["relative_frobenius_error"])
    ccfg = json.loads((run / "lora-rank-3" / "adapter_config.json").read_text())
    assert max(ccfg["rank_pattern"].values()) == 3


def test_exact_lora_of_a_tied_model_and_merged_terms(tmp_path):
    """Tied embeddings: the exact adapter covers embed_tokens and lm_head with the same factors, and
    base + adapter (plain PEFT) gives the materialised model's logits; a merged term (the step
    search's kind) and a repeated seed give the adapter of their plain sum (rank K*R, K distinct seeds)."""
    import peft
    from transformers import LlamaConfig, LlamaForCausalLM

    from corp.algorithms.perturb.direction import Merged
    from corp.methods.consolidate.lowrank import exact_lora, export_lora

    tok = make_char_tokenizer()
    torch.manual_seed(1)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path / "base")
    scheme = "corp-lowrank-v1:r=2"
    comps = (Component(5, 0.05, 0.6), Component(8, 0.05, -0.4), Component(5, 0.05, 0.2))
    d = Direction([Merged(1.5, comps)])
    pert = Perturber(model, scheme=scheme)
    params = [(n, p.shape) for n, p in pert.params]
    assert "lm_head.weight" not in dict(params), "tied: one tensor, under the embedding's name"
    exact = exact_lora(d, params, scheme)
    assert set(exact.ranks.values()) == {4}, "two distinct seeds x r=2"
    flat = exact_lora(Direction([Component(5, 0.05, 1.2), Component(8, 0.05, -0.6)]), params, scheme)
    for n in exact.factors:
        (B, A), (Bf, Af) = exact.factors[n], flat.factors[n]
        assert torch.allclose(B @ A, Bf @ Af, atol=1e-7), n
    export_lora(exact, model, tmp_path / "lora")
    ids = torch.tensor([[3, 5, 7, 9, 11, 4]])
    with torch.no_grad():
        base_logits = model(ids).logits
        pert.apply(d)
        want = model(ids).logits
        pert.restore()
    with warnings.catch_warnings():  # PEFT's note about adapting tied modules
        warnings.simplefilter("ignore")
        base = LlamaForCausalLM.from_pretrained(tmp_path / "base").eval()
        lora = peft.PeftModel.from_pretrained(base, tmp_path / "lora")
    wrapped = {n for n, _ in lora.named_modules() if n.endswith("lm_head") or n.endswith("embed_tokens")}
    assert any(n.endswith("lm_head") for n in wrapped) and any(n.endswith("embed_tokens") for n in wrapped)
    with torch.no_grad():
        got = lora(input_ids=ids).logits
    assert (want - base_logits).abs().max() > 1e-3
    assert torch.allclose(got, want, atol=5e-5, rtol=0), float((got - want).abs().max())


def test_a_lora_rank_above_the_exact_rank_names_the_directory_and_its_real_rank(tiny_dir, tmp_path):
    """--lora-r 1000 on an update of rank K*R < 1000: the adapter written has rank K*R; the warning
    names its directory and that rank, and the report records it (issue 41: it said rank 1000)."""
    from corp.methods.consolidate.run import low_rank_line, run_consolidate

    model_dir, _ = tiny_dir
    run = tmp_path / "run"
    with pytest.warns(UserWarning, match="--lora-r 1000") as caught:
        report = run_consolidate(_cfg(model_dir, run, noise="lowrank:r=2", export_lora=True, lora_rank=1000))
    ex = report["corp"]["low_rank"]["exact_lora"]
    comp, where = ex["compressed"], run / "lora-rank-1000"
    real = max(json.loads((where / "adapter_config.json").read_text())["rank_pattern"].values())
    assert real == ex["max_rank"] < 1000 and comp["rank"] == real and comp["requested_rank"] == 1000
    said = [str(w.message) for w in caught if "--lora-r 1000" in str(w.message)]
    assert len(said) == 1 and str(where) in said[0] and f"rank {real}" in said[0], said
    assert f"rank-{real} SVD adapter" in low_rank_line(report["corp"]["low_rank"])
