"""F-TIS (corp/methods/ftis/): the truncated importance weight, the KL filter, equality with
plain GRPO (and TRL) on on-policy data, sharing across tokenizers, and the command end to end."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import string
from types import SimpleNamespace

import pytest
import torch

from corp.algorithms.grpo.trainer import aggregate, per_token_loss
from corp.errors import CorpError
from corp.methods.ftis.node import Node, Rollout, ftis_token_loss, generator_kl, keep_mask, tis_weights
from tests.conftest import make_char_tokenizer, make_tiny_llama


def test_cap_truncates_off_policy_weights_only():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]))
    mu = torch.log(torch.tensor([[0.1, 0.4, 0.9], [0.1, 0.4, 0.9]]))  # ratios 5, 1.25, 0.556
    w = tis_weights(old, mu, torch.tensor([True, False]), cap=2.0)
    torch.testing.assert_close(w[0], torch.tensor([2.0, 1.25, 0.5 / 0.9]))  # 5 truncated to C
    torch.testing.assert_close(w[1], torch.ones(3))  # on-policy: no weight
    assert not w.requires_grad
    # a larger cap lets the ratio through
    assert float(tis_weights(old, mu, torch.tensor([True, True]), cap=10.0)[0, 0]) == pytest.approx(5.0)


def test_generator_kl_is_summed_over_valid_tokens_and_zero_on_policy():
    old = torch.log(torch.tensor([[0.5, 0.2, 0.3]]))
    mu = torch.log(torch.tensor([[0.25, 0.2, 0.9]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    r = 2.0  # first token; second r = 1 adds 0; third masked
    assert float(generator_kl(old, mu, mask)) == pytest.approx(r * math.log(r) - r + 1)
    assert float(generator_kl(old, old, torch.ones(1, 3))) == 0.0


def test_filter_drops_exactly_off_policy_with_nonpositive_advantage_and_large_kl():
    B, T = 6, 4
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(B, T, generator=g) - 0.5
    mu = old.clone()
    mask = torch.ones(B, T)
    far = torch.tensor([True, True, False, True, True, True])  # rows whose generator is far away (KL >> gamma)
    mu[far] = old[far] - 20.0  # pi_old / mu = e^20 per token: KL in the hundreds
    adv = torch.tensor([1.0, -1.0, -1.0, 0.0, -2.0, 0.5])
    off = torch.tensor([True, True, True, True, False, True])
    gamma = 50.0
    kl = generator_kl(old, mu, mask)
    assert all(float(kl[i]) > gamma for i in range(B) if far[i]) and float(kl[2]) < gamma
    keep = keep_mask(adv, kl, off, gamma)
    # dropped: off-policy AND advantage <= 0 AND KL >= gamma -> rows 1 and 3 (advantage 0 counts as not positive)
    assert keep.tolist() == [True, False, True, False, True, True]
    logps = (old + 0.1 * torch.randn(B, T, generator=g)).requires_grad_(True)
    loss, w, kept, _ = ftis_token_loss(logps, logps.detach(), mu, adv, mask, off, 0.2, 0.2, 2.0, gamma)
    assert kept.tolist() == keep.tolist()
    loss.sum().backward()
    assert torch.all(loss[~keep] == 0) and torch.all(logps.grad[~keep] == 0)
    assert torch.all(logps.grad[keep & (adv != 0)].abs().sum(-1) > 0)  # the kept rows with a signal still train
    # far, off-policy, advantage positive: kept, with the capped weight C on every token
    torch.testing.assert_close(w[0], torch.full((T,), 2.0))
    # a smaller gamma also drops the near row with negative advantage once its KL exceeds it
    assert keep_mask(adv, kl, off, gamma=float(kl[2]) / 2).tolist() == [True, False, False, False, True, True]


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_on_policy_only_equals_plain_grpo_and_trl(loss_type):
    from tests.test_grpo import trl_loss

    g = torch.Generator().manual_seed(3)
    B, T, max_len = 6, 5, 7
    lengths = torch.tensor([5, 2, 4, 1, 5, 3])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    base = -torch.rand(B, T, generator=g) * 3
    adv = torch.randn(B, generator=g)
    off = torch.zeros(B, dtype=torch.bool)
    mu = base - 30.0  # garbage generator logprobs: ignored for on-policy rows (weight 1, never filtered)
    ours_lp = base.clone().requires_grad_(True)
    plain_lp = base.clone().requires_grad_(True)
    trl_lp = base.clone().requires_grad_(True)
    tok, w, keep, _ = ftis_token_loss(ours_lp, ours_lp.detach(), mu, adv, mask, off, 0.2, 0.2, 2.0, 50.0)
    assert torch.all(w == 1) and keep.all()
    ours = aggregate(tok, mask, loss_type, 1, max_len, float(mask.sum()))
    plain = aggregate(
        per_token_loss(plain_lp, plain_lp.detach(), adv, mask, 0.2, 0.2), mask, loss_type, 1, max_len, float(mask.sum())
    )
    theirs = trl_loss(loss_type, trl_lp, trl_lp.detach(), None, adv, mask, 0.0, 0.2, 0.2, 1, max_len, float(mask.sum()))
    torch.testing.assert_close(ours, plain, rtol=0, atol=0)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    for x in (ours, plain, theirs):
        x.backward()
    torch.testing.assert_close(ours_lp.grad, plain_lp.grad, rtol=0, atol=0)
    torch.testing.assert_close(ours_lp.grad, trl_lp.grad, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- across tokenizers


def make_other_tokenizer():
    """A character tokenizer with another vocabulary (reversed order, extra pieces): ids do not transfer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "</s>", "<unk>", "<pad>"]
    chars = list(reversed(string.digits + string.ascii_letters + string.punctuation + " \n"))
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def _fake_node(tok, index=1, no_retokenize=False):
    return SimpleNamespace(
        index=index, name="fake", tokenizer=tok, bytes_received=0, cfg=SimpleNamespace(no_retokenize=no_retokenize)
    )


def test_receive_across_tokenizers_spreads_the_sequence_logprob_and_counts_text_bytes():
    a, b = make_char_tokenizer(), make_other_tokenizer()
    r = Rollout(
        sender=0,
        prompt_index=0,
        token_ids=a("42", add_special_tokens=False)["input_ids"] + [a.eos_token_id],
        text="42",
        logprobs=[-0.5, -1.0, -0.3],
        finished=True,
    )
    node = _fake_node(b)
    ids, mu, off = Node.receive(node, r, a)
    assert off and ids == b("42", add_special_tokens=False)["input_ids"] + [
        b.eos_token_id
    ]  # re-tokenised, local EOS appended
    assert sum(mu) == pytest.approx(-1.8) and len(set(mu)) == 1  # the sender's sequence logprob, spread evenly
    assert node.bytes_received == len("42") + 4 + 1
    same = _fake_node(a)
    ids2, mu2, _ = Node.receive(same, r, a)
    assert (
        ids2 == r.token_ids and mu2 == r.logprobs and same.bytes_received == 8 * len(r.token_ids)
    )  # ids + float32 logprobs
    with pytest.raises(CorpError, match="--no-retokenize"):
        Node.receive(_fake_node(b, no_retokenize=True), r, a)


# ---------------------------------------------------------------- the command


def _save(model, tok, d):
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


ARGS = [
    "--task",
    "arith",
    "--max-steps",
    "2",
    "--prompts-per-step",
    "2",
    "--num-generations",
    "2",
    "--learning-rate",
    "1e-3",
    "--n-support",
    "4",
    "--n-probe",
    "0",
    "--n-validation",
    "0",
    "--n-test",
    "3",
    "--max-completion-length",
    "4",
    "--reward",
    "tests.test_methods:text_checksum",
]


def test_corp_ftis_cli_end_to_end_heterogeneous(tmp_path):
    from typer.testing import CliRunner

    from corp.cli import app

    a_tok, b_tok = make_char_tokenizer(), make_other_tokenizer()
    a = _save(make_tiny_llama(a_tok, seed=0), a_tok, tmp_path / "a")
    b_model = make_tiny_llama(b_tok, seed=1)
    b_model.generation_config.eos_token_id = b_tok.eos_token_id
    b = _save(b_model, b_tok, tmp_path / "b")
    run = tmp_path / "run"
    res = CliRunner().invoke(
        app, ["ftis", "--nodes", f"{a},{b}", *ARGS, "--ood-task", "countdown", "--output-dir", str(run)]
    )
    assert res.exit_code == 0, res.output
    report = json.loads((run / "report.json").read_text())
    assert report["method"] == "ftis" and [n["model"] for n in report["nodes"]] == [a, b]
    steps = [r for r in report["per_step"] if r["arm"] == "ftis"]
    assert len(steps) == 4  # 2 nodes x 2 steps
    for r in steps:
        assert r["off_policy"] == 4 and r["bytes_received"] > 0 and r["bytes_sent"] > 0
    for n in report["nodes"]:  # text + 4-byte sequence logprob + flag per completion, never 8 bytes a token of ids
        assert n["bytes_sent"] == sum(r["bytes_sent"] for r in steps if r["node"] == n["node"])
        assert n["training_ledger"]["trained_tokens"] > 0 and n["grpo_training_ledger"]["trained_tokens"] > 0
    keys = set(report["accuracy_per_step"])
    assert {"node0-ftis-test", "node1-grpo-test", "node0-ftis-ood", "node1-grpo-ood"} <= keys
    assert set(report["accuracy_per_step"]["node0-ftis-test"]) == {"0", "1", "2"}
    assert {r["method"] for r in report["rows"]} == {
        f"node{k}-{arm}" for k in (0, 1) for arm in ("base", "ftis", "grpo")
    }
    # the same nodes, but text sharing forbidden: one line, nothing run
    res = CliRunner().invoke(
        app,
        [
            "ftis",
            "--nodes",
            f"{a},{b}",
            *ARGS,
            "--no-retokenize",
            "--skip-grpo-baseline",
            "--output-dir",
            str(tmp_path / "r2"),
        ],
    )
    assert res.exit_code != 0
    assert "--no-retokenize" in res.output and "Traceback" not in res.output


def test_node_that_cannot_be_loaded_is_one_line(tmp_path):
    import subprocess
    import sys

    tok = make_char_tokenizer()
    a = _save(make_tiny_llama(tok), tok, tmp_path / "a")
    run = tmp_path / "run"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "corp.cli",
            "ftis",
            "--nodes",
            f"{a},{tmp_path / 'missing-model'}",
            *ARGS,
            "--output-dir",
            str(run),
        ],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "CORP_NO_PROGRESS": "1", "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode != 0
    lines = [x for x in out.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: node 1 (") and "missing-model" in lines[0], out.stderr
    assert not run.exists()


def test_bad_options_are_one_line(tmp_path):
    from corp.config import load_config
    from corp.methods.ftis import FTISConfig

    with pytest.raises(CorpError, match="two or more nodes"):
        load_config(FTISConfig, None, {"nodes": "smollm2-135m"})
    with pytest.raises(CorpError, match="--tis-cap"):
        load_config(FTISConfig, None, {"tis_cap": 0})
    with pytest.raises(CorpError, match="--kl-filter"):
        load_config(FTISConfig, None, {"kl_filter": -1})


def test_grpo_options_ftis_lacks_are_refused_not_ignored():
    """FTISConfig extends GRPOConfig: every inherited option F-TIS does not implement is one line, never a silent no-op."""
    from corp.config import flag, load_config
    from corp.methods.ftis.config import UNSUPPORTED, FTISConfig

    other = {"loss": "cov", "beta": 0.1, "num_iterations": 2, "lora_r": 8, "lora_alpha": 16, "lora_targets": "q_proj"}
    assert set(other) == set(UNSUPPORTED)
    for name, value in other.items():
        with pytest.raises(CorpError, match=f"{flag(name, FTISConfig)} {value}: corp ftis does not support it"):
            load_config(FTISConfig, None, {name: value})
    load_config(FTISConfig, None, {"epsilon_high": 0.3, "scale_rewards": "none", "checkpoint_every": 2})  # these work
    with pytest.raises(CorpError, match="--num-generations must be >= 1"):
        load_config(FTISConfig, None, {"num_generations": 0})
    assert (
        load_config(FTISConfig, None, {"num_generations": 1, "grad_accum": 3}).num_generations == 1
    )  # mixed group K x G


def test_trained_as_key_of_a_run_from_before_the_grpo_config():
    """The evaluation-cache key of F-TIS's trained weights is the one it had before FTISConfig extended GRPOConfig
    (the inherited options at their defaults do not enter it); an inherited option that works changes it."""
    from corp.config import config_to_dict, load_config
    from corp.methods.ftis import FTISConfig
    from corp.methods.ftis.run import _trained_as

    cfg = load_config(FTISConfig, None, {"steps": 2, "tis_cap": 1.5})
    before = (
        "loss",
        "epsilon_high",
        "beta",
        "scale_rewards",
        "num_iterations",
        "lora_r",
        "lora_alpha",
        "lora_targets",
        "checkpoint_every",
        "run_dir",
        "threads",
        "report_to",
        "eval_every",
        "ood_task",
        "skip_grpo_baseline",
        "skip_test_eval",
        "eval_nodes",  # added later, not training (which nodes are evaluated on test)
    )
    old = {k: v for k, v in config_to_dict(cfg).items() if k not in before}  # the fields and exclusions of the old key
    assert _trained_as(cfg) == hashlib.sha256(json.dumps(old, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert _trained_as(dataclasses.replace(cfg, epsilon_high=0.3)) != _trained_as(cfg)
    assert _trained_as(dataclasses.replace(cfg, scale_rewards="none")) != _trained_as(cfg)
    assert _trained_as(dataclasses.replace(cfg, checkpoint_every=2)) == _trained_as(cfg)
