"""GRPO core: the loss equals TRL's GRPOTrainer on identical inputs; a few steps raise a planted reward."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from corp import CorpError
from corp.baselines.grpo.core import GRPOConfig, aggregate, group_advantages, per_token_loss, run_grpo
from corp.config import load_config
from corp.evaluate.backends.hf import HFBackend
from tests.conftest import make_char_tokenizer, make_tiny_llama


def digits(completions, **columns):
    """Planted reward: the fraction of generated characters that are digits."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


# ---------------------------------------------------------------- equality with TRL


def trl_loss(loss_type, logps, old, ref, adv, mask, beta, eps_low, eps_high, grad_accum, max_len, num_items):
    """Run TRL's own GRPOTrainer._compute_loss with the model forward replaced by the given logprobs."""
    trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
    fake = SimpleNamespace(
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token",
        beta=beta, loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high, use_vllm=False,
        vllm_importance_sampling_correction=False, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=grad_accum, max_completion_length=max_len, _entropy_bonus_enabled=False,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=grad_accum),
        accelerator=SimpleNamespace(num_processes=1, gather=lambda x: x, gather_for_metrics=lambda x: x, reduce=lambda x, reduction="sum": x),
        _metrics=defaultdict(lambda: defaultdict(list)),
    )
    fake._get_per_token_logps_and_entropies = lambda *a, **k: (logps, torch.ones_like(logps), None)
    B, T = logps.shape
    inputs = {
        "prompt_ids": torch.zeros(B, 3, dtype=torch.long), "prompt_mask": torch.ones(B, 3, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask.long(),
        "advantages": adv, "old_per_token_logps": old, "num_items_in_batch": torch.tensor(float(num_items)),
    }
    if beta:
        inputs["ref_per_token_logps"] = ref
    return trl_grpo.GRPOTrainer._compute_loss(fake, None, inputs)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_loss_matches_trl_grpotrainer(loss_type, beta):
    g = torch.Generator().manual_seed(1)
    B, T, grad_accum, max_len = 8, 7, 2, 9
    lengths = torch.tensor([7, 3, 5, 1, 6, 7, 2, 4])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    old = -torch.rand(B, T, generator=g) * 3
    logps = (old + 0.4 * torch.randn(B, T, generator=g)).requires_grad_(True)  # ratios well outside the clip range
    ref = old + 0.2 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    total_tokens = float(mask.sum())
    micro = B // grad_accum
    for k in range(grad_accum):
        sl = slice(k * micro, (k + 1) * micro)
        ours_lp = logps[sl].detach().clone().requires_grad_(True)
        trl_lp = logps[sl].detach().clone().requires_grad_(True)
        tok = per_token_loss(ours_lp, old[sl], adv[sl], mask[sl], 0.2, 0.28, beta, ref[sl])
        ours = aggregate(tok, mask[sl], loss_type, grad_accum, max_len, total_tokens)
        theirs = trl_loss(loss_type, trl_lp, old[sl], ref[sl], adv[sl], mask[sl], beta, 0.2, 0.28, grad_accum, max_len, total_tokens)
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
        ours.backward()
        theirs.backward()
        torch.testing.assert_close(ours_lp.grad, trl_lp.grad, rtol=1e-6, atol=1e-7)


def test_group_advantages_match_trl_formula():
    trl_utils = pytest.importorskip("trl.trainer.utils")
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    mean = r.view(-1, 4).mean(1).repeat_interleave(4)
    std = trl_utils.nanstd(r.view(-1, 4), dim=1).reshape(-1).repeat_interleave(4)
    torch.testing.assert_close(group_advantages(r, 4), (r - mean) / (std + 1e-4))
    torch.testing.assert_close(group_advantages(r, 4, scale=False), r - mean)
    assert torch.all(group_advantages(r, 4)[4:] == 0), "a group with equal rewards has no signal"


def test_cov_weights_downweight_extreme_tokens():
    from corp.baselines.grpo.cov import covariance_weights

    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    logps = torch.tensor([[-1.0, -1.0, -9.0], [-1.0, -1.0, -1.0]])
    mask = torch.ones(2, 3)
    w = covariance_weights(adv, logps, mask)
    assert w.shape == adv.shape and torch.all((w > 0) & (w <= 1))
    assert w[0, 2] == w.min(), "the token with extreme advantage x logprob covariance gets the smallest weight"


def test_reco_weights_favour_rare_completions():
    from corp.baselines.grpo.reco import ReCo, occurrence_weights

    logps = torch.tensor([[-0.1, -0.1], [-3.0, -3.0], [-0.1, -0.1], [-0.1, -0.1]])
    w = occurrence_weights(logps, torch.ones(4, 2), 4)
    assert torch.isclose(w.sum(), torch.tensor(4.0)) and w[1] == w.max()
    lp = torch.tensor([[-0.5]])
    assert torch.isclose(ReCo().ratio(lp, lp), torch.tensor([[1.0]])), "on-policy variance ratio is 1"


# ---------------------------------------------------------------- training on a tiny model


def tiny_grpo_cfg(run_dir, **kw):
    base = dict(task="arith", reward="tests.test_grpo:digits", n_support=8, n_probe=0, n_validation=0, n_test=4, max_new_tokens=6,
                steps=8, prompts_per_step=2, num_generations=8, learning_rate=1e-2, run_dir=str(run_dir), skip_test_eval=True, batch_size=16)
    base.update(kw)
    return load_config(GRPOConfig, None, base)


def fresh_backend():
    tok = make_char_tokenizer()
    return HFBackend(make_tiny_llama(tok), tok, batch_size=16)


def sampled_reward(backend, n=64):
    gens = backend.generate(["What is 1 + 2?"], 6, temperature=1.0, n=n, seed=123)
    return sum(digits(gens.texts)) / n


@pytest.mark.parametrize("loss", ["grpo", "cov", "reco"])
def test_grpo_steps_raise_planted_reward(tmp_path, loss):
    backend = fresh_backend()
    before = sampled_reward(backend)
    report = run_grpo(tiny_grpo_cfg(tmp_path / loss, loss=loss), backend)
    after = sampled_reward(backend)
    print(f"{loss}: sampled reward {before:.3f} -> {after:.3f}")
    assert after > before + 0.05, f"{loss}: reward {before:.3f} -> {after:.3f}"
    assert report["training_ledger"]["trained_tokens"] > 0
    from corp.runs import read_jsonl

    rows = read_jsonl(tmp_path / loss / "metrics.jsonl", key="step")
    assert [r["step"] for r in rows] == list(range(1, 9)) and all(r["entropy"] > 0 for r in rows)


def test_grpo_resume_continues_to_same_weights(tmp_path):
    full_b = fresh_backend()
    run_grpo(tiny_grpo_cfg(tmp_path / "full", steps=4, checkpoint_every=2), full_b)
    cut_b = fresh_backend()
    run_grpo(tiny_grpo_cfg(tmp_path / "cut", steps=2, checkpoint_every=2), cut_b)
    resumed_b = fresh_backend()
    run_grpo(tiny_grpo_cfg(tmp_path / "cut", steps=4, checkpoint_every=2), resumed_b)
    for (n, a), (_, b) in zip(full_b.model.state_dict().items(), resumed_b.model.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)


def test_grpo_lora_trains_adapter_only(tmp_path):
    pytest.importorskip("peft")
    backend = fresh_backend()
    report = run_grpo(tiny_grpo_cfg(tmp_path / "lora", steps=2, lora_r=4, learning_rate=1e-2), backend)
    assert 0 < report["trainable_params"] < backend.n_params / 4
    assert (tmp_path / "lora" / "model" / "config.json").exists() and (tmp_path / "lora" / "adapter").exists()


def test_bad_options_are_one_line_errors(tmp_path):
    with pytest.raises(CorpError, match="--loss"):
        tiny_grpo_cfg(tmp_path, loss="ppo")
    with pytest.raises(CorpError, match="--grad-accum"):
        tiny_grpo_cfg(tmp_path, grad_accum=3)
    with pytest.raises(CorpError, match="--num-generations"):
        tiny_grpo_cfg(tmp_path, num_generations=1)


def test_corp_grpo_cli_end_to_end(tmp_path):
    import json

    from typer.testing import CliRunner

    from corp.cli import app

    tok = make_char_tokenizer()
    model_dir = tmp_path / "m"
    make_tiny_llama(tok).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    args = ["grpo", "--model", str(model_dir), "--task", "arith", "--loss", "cov", "--steps", "2", "--prompts-per-step", "2", "--num-generations", "4",
            "--n-support", "4", "--n-probe", "0", "--n-validation", "0", "--n-test", "2", "--max-new-tokens", "4", "--run-dir", str(tmp_path / "run")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["steps"] == 2 and report["training_ledger"]["trained_tokens"] > 0
    assert (tmp_path / "run" / "model" / "config.json").exists()
    bad = CliRunner().invoke(app, args[:-2] + ["--loss", "ppo"])
    assert bad.exit_code == 2 and "--loss 'ppo'" in bad.output
