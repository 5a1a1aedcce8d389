"""GRPO core: the loss equals TRL's GRPOTrainer on identical inputs; a few steps raise a planted reward."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from corp.algorithms.grpo import LOSS_VARIANTS
from corp.algorithms.grpo.trainer import GRPOConfig, aggregate, group_advantages, per_token_loss
from corp.config import load_config
from corp.errors import CorpError
from corp.methods.grpo import run_grpo
from corp.runtime.backends.hf import HFBackend
from tests.conftest import make_char_tokenizer, make_tiny_llama


def digits(completions, **columns):
    """Planted reward: the fraction of generated characters that are digits."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


# ---------------------------------------------------------------- equality with TRL


def trl_loss(loss_type, logps, old, ref, adv, mask, beta, eps_low, eps_high, grad_accum, max_len, num_items):
    """Run TRL's own GRPOTrainer._compute_loss with the model forward replaced by the given logprobs."""
    trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
    fake = SimpleNamespace(
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=beta,
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=grad_accum,
        max_completion_length=max_len,
        _entropy_bonus_enabled=False,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=grad_accum),
        accelerator=SimpleNamespace(
            num_processes=1, gather=lambda x: x, gather_for_metrics=lambda x: x, reduce=lambda x, reduction="sum": x
        ),
        _metrics=defaultdict(lambda: defaultdict(list)),
    )
    fake._get_per_token_logps_and_entropies = lambda *a, **k: (logps, torch.ones_like(logps), None)
    B, T = logps.shape
    inputs = {
        "prompt_ids": torch.zeros(B, 3, dtype=torch.long),
        "prompt_mask": torch.ones(B, 3, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": adv,
        "old_per_token_logps": old,
        "num_items_in_batch": torch.tensor(float(num_items)),
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
        theirs = trl_loss(
            loss_type, trl_lp, old[sl], ref[sl], adv[sl], mask[sl], beta, 0.2, 0.28, grad_accum, max_len, total_tokens
        )
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


def test_cov_weights_hand_computed():
    """docs/methods.md's kernel on three valid tokens (one padded position):
    logp (0, -3 | -3), A (1, 1 | -2); mean logp -2, mean A 0; c = (2, -1, 2); mean c 1, population
    variance ((1)^2 + (-2)^2 + 1^2) / 3 = 2; raw w = exp(-c^2 / 4) = (e^-1, e^-1/4, e^-1);
    normalised to mean 1: w = 3 e^-1 / (2 e^-1 + e^-1/4) = 0.72869, 3 e^-1/4 / (...) = 1.54263.
    The old rule (c centred inside the kernel, no normalisation) gave (0.779, 0.105, 0.779)."""
    from corp.algorithms.grpo.cov import covariance_weights

    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    logps = torch.tensor([[0.0, -3.0], [-3.0, -50.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    w = covariance_weights(adv, logps, mask)
    e1, e4 = torch.exp(torch.tensor(-1.0)), torch.exp(torch.tensor(-0.25))
    expected = torch.stack([3 * e1, 3 * e4, 3 * e1, torch.tensor(0.0)]) / (2 * e1 + e4)
    torch.testing.assert_close(w.flatten(), expected.reshape(-1), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(w.flatten(), torch.tensor([0.72869, 1.54263, 0.72869, 0.0]), rtol=1e-4, atol=1e-5)
    assert torch.isclose(w[mask.bool()].mean(), torch.tensor(1.0))


def test_cov_weights_degenerate_batches():
    from corp.algorithms.grpo.cov import covariance_weights

    mask = torch.ones(2, 2)
    flat = covariance_weights(torch.zeros(2, 2), torch.randn(2, 2), mask)  # no advantage: plain GRPO
    assert torch.equal(flat, torch.ones(2, 2))
    # nearly equal, nonzero covariances (sigma << |c|) must not underflow to 0 / 0
    w = covariance_weights(
        torch.tensor([[1.0, 1.0], [-1.0, -1.0]]), torch.tensor([[-1.0, -1.0 + 1e-3], [-3.0, -3.0]]), mask
    )
    assert torch.isfinite(w).all() and torch.isclose(w.mean(), torch.tensor(1.0))


def test_reco_weights_hand_computed():
    from corp.algorithms.grpo.reco import occurrence_weights, variance_weights

    # omega: mean logp per sequence (-0.1, -3); 1 / (G p) proportional to (e^0.1, e^3), normalised to sum G = 2
    logps = torch.tensor([[-0.1, -0.1], [-3.0, -3.0]])
    w = occurrence_weights(logps, torch.ones(2, 2), 2)
    e = torch.exp(torch.tensor([0.1, 3.0]))
    torch.testing.assert_close(w, 2 * e / e.sum())
    assert w[1] > 1 > w[0], "the rare completion counts more"
    # v: p = (0.5, 0.9, 0.99 x 8, padded); p(1 - p) = (0.25, 0.09, 0.0099 x 8); mean 0.04192;
    # normalised (5.964 -> clipped to 4, 2.147, 0.2362 x 8)
    p = torch.tensor([[0.5, 0.9] + [0.99] * 8 + [0.3]])
    mask = torch.ones_like(p)
    mask[0, -1] = 0
    v = variance_weights(p.log(), mask)
    raw = p * (1 - p)
    mean = raw[0, :10].mean()
    torch.testing.assert_close(v[0, :10], (raw[0, :10] / mean).clamp(max=4.0))
    assert v[0, 0] == 4.0 and v[0, -1] == 0.0 and abs(float(mean) - 0.04192) < 1e-5
    torch.testing.assert_close(v[0, 1:3], torch.tensor([2.1469, 0.23616]), rtol=1e-4, atol=1e-4)


def _one_step_probs(p0: torch.Tensor, adv: torch.Tensor, loss: str, lr: float = 0.5) -> torch.Tensor:
    """Each token's probability is sigmoid(theta) of its own logit (a two-way choice, the sampled
    token being option 1); one SGD step on the core's per-token loss (dapo aggregation), on-policy."""
    from corp.algorithms.grpo import get_loss
    from corp.algorithms.grpo.trainer import Batch

    theta = torch.logit(p0).clone().requires_grad_(True)
    mask = torch.ones_like(p0)
    variant = get_loss(loss)
    logps = torch.nn.functional.logsigmoid(theta)
    batch = Batch(None, None, mask.long(), adv, torch.zeros(len(adv), dtype=torch.long), [], [])
    rw = variant.response_weights(batch, logps.detach(), len(adv)) if variant.needs_response_logps else None
    tok = per_token_loss(logps, logps.detach(), adv, mask, 0.2, 0.2, variant=variant, response_weights=rw)
    aggregate(tok, mask, "dapo", 1, p0.size(1), float(mask.sum())).backward()
    with torch.no_grad():
        return torch.sigmoid(theta - lr * theta.grad)


@pytest.mark.parametrize("loss", sorted(LOSS_VARIANTS))
def test_one_update_raises_a_confident_token_with_positive_advantage(loss):
    """Issue 10: ReCo's old variance ratio differentiated to (1 - 2p) / (1 - p) x GRPO's gradient and
    pushed a p = 0.9 token with A > 0 down. Every registered variant must move every token the way GRPO does."""
    p0 = torch.tensor([[0.9, 0.6, 0.97], [0.9, 0.3, 0.5], [0.9, 0.8, 0.2]])
    adv = torch.tensor([1.0, -1.0, 0.5])
    p1 = _one_step_probs(p0, adv, loss)
    assert p1[0, 0] > 0.9, f"{loss}: p 0.9 with A > 0 -> {float(p1[0, 0]):.5f}"
    assert torch.all(torch.sign(p1 - p0) == torch.sign(adv).unsqueeze(1)), f"{loss}: {p1 - p0}"


def test_loss_variants_registry_one_file_one_line():
    from corp.algorithms.grpo import LOSS_VARIANTS, LossVariant, get_loss, register_loss

    assert {"grpo", "cov", "reco"} <= set(LOSS_VARIANTS)

    @register_loss
    class Halve(LossVariant):
        name = "test-halve"

        def token_weights(self, logps, adv, mask):
            return 0.5 * mask

    try:
        assert isinstance(get_loss("test-halve"), Halve)
        GRPOConfig(loss="test-halve").validate()
        g = torch.Generator().manual_seed(0)
        logps, mask, adv = -torch.rand(2, 3, generator=g), torch.ones(2, 3), torch.tensor([1.0, -1.0])
        torch.testing.assert_close(
            per_token_loss(logps, logps, adv, mask, 0.2, 0.2, variant=Halve()),
            0.5 * per_token_loss(logps, logps, adv, mask, 0.2, 0.2),
        )
        with pytest.raises(CorpError, match="unique name"):
            register_loss(Halve)
    finally:
        LOSS_VARIANTS.pop("test-halve", None)
    with pytest.raises(CorpError, match="--loss 'nope' is unknown; choose one of grpo"):
        get_loss("nope")


# ---------------------------------------------------------------- training on a tiny model


def tiny_grpo_cfg(run_dir, **kw):
    base = dict(
        task="arith",
        reward="tests.test_grpo:digits",
        n_support=8,
        n_probe=0,
        n_validation=0,
        n_test=4,
        max_new_tokens=6,
        steps=8,
        prompts_per_step=2,
        num_generations=8,
        learning_rate=1e-2,
        run_dir=str(run_dir),
        skip_test_eval=True,
        batch_size=16,
    )
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
    from corp.runtime.runs import read_jsonl

    rows = read_jsonl(tmp_path / loss / "metrics.jsonl", key="step")
    assert [r["step"] for r in rows] == list(range(1, 9)) and all(r["entropy"] > 0 for r in rows)


def confident_backend():
    """A tiny model whose tokens are confident: the LM head gets a bias so that '1' has p ~ 0.6 and
    'x' ~ 0.25 at every position (the random weights, scaled down, only perturb this). Under the
    `digits` reward the confident token is the rewarded one: the case issue 10 worried about."""
    tok = make_char_tokenizer()
    model = make_tiny_llama(tok)
    old = model.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(0.1 * old.weight)
        head.bias.zero_()
        head.bias[tok.convert_tokens_to_ids("1")] = 6.0
        head.bias[tok.convert_tokens_to_ids("x")] = 5.0
    model.lm_head = head
    return HFBackend(model, tok, batch_size=16)


RECO_CONFIDENT = (
    "docs/methods.md's ReCo (omega x v) lowers this mode-correlated planted reward at lr 1e-2: -0.15, -0.23, -0.25 "
    "on seeds 0-2, where v alone gives +0.37 and omega alone +0.29: omega lifts the rare (here low-reward) "
    "completions up to ~10x and v mutes their rare tokens, so the net step pushes the confident rewarded "
    "token down. Reported in the noise-grpo notes for the spec's owner; strict, so a fix shows up here."
)


@pytest.mark.parametrize(
    "loss", ["grpo", "cov", pytest.param("reco", marks=pytest.mark.xfail(reason=RECO_CONFIDENT, strict=True))]
)
def test_grpo_steps_raise_planted_reward_on_a_confident_model(tmp_path, loss):
    backend = confident_backend()
    before = sampled_reward(backend)
    assert before > 0.5, "the planted model should already favour the rewarded token"
    run_grpo(tiny_grpo_cfg(tmp_path / loss, loss=loss), backend)
    after = sampled_reward(backend)
    print(f"{loss} (confident model): sampled reward {before:.3f} -> {after:.3f}")
    assert after > before + 0.05, f"{loss}: reward {before:.3f} -> {after:.3f}"


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


def test_grpo_lora_reproduces_whatever_the_process_drew_before(tmp_path):
    """LoRA's A matrices are random: two runs of one config must start from the same adapters even
    when the process's RNG stood elsewhere (torch's default seed differs in every process)."""
    pytest.importorskip("peft")
    weights = []
    for i, draws in enumerate((0, 5)):
        backend = fresh_backend()
        torch.rand(draws)  # what other code (or another process) took from the global generator first
        run_grpo(tiny_grpo_cfg(tmp_path / f"run{i}", steps=2, lora_r=4, learning_rate=1e-2), backend)
        weights.append({n: t.clone() for n, t in backend.model.state_dict().items()})
    assert weights[0].keys() == weights[1].keys()
    for n in weights[0]:
        assert torch.equal(weights[0][n], weights[1][n]), n


def test_bad_options_are_one_line_errors(tmp_path):
    with pytest.raises(CorpError, match="--loss"):
        tiny_grpo_cfg(tmp_path, loss="ppo")
    with pytest.raises(CorpError, match="--gradient-accumulation-steps"):
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
    args = [
        "grpo",
        "--model",
        str(model_dir),
        "--task",
        "arith",
        "--loss",
        "cov",
        "--max-steps",
        "2",
        "--prompts-per-step",
        "2",
        "--num-generations",
        "4",
        "--n-support",
        "4",
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
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["steps"] == 2 and report["training_ledger"]["trained_tokens"] > 0
    assert (tmp_path / "run" / "model" / "config.json").exists()
    bad = CliRunner().invoke(app, args[:-2] + ["--loss", "ppo"])
    assert bad.exit_code == 2 and "--loss 'ppo'" in bad.output
