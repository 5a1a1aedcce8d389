"""Retention (issue 39): bits per byte on held-out text and `corp eval --retention`."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from corp.cli import app
from corp.errors import CorpError
from corp.evaluate.retention import bits_per_byte, bpb_change, clean_text, retention_text, windows
from tests.conftest import make_char_tokenizer, make_tiny_llama

TEXT = "the cat sat on the mat. the dog sat on the log.\n\n" * 12


class FixedLogits(torch.nn.Module):
    """A model whose next-token logits are the same everywhere (uniform, or a unigram of a text)."""

    def __init__(self, logits: torch.Tensor, context: int = 256):
        super().__init__()
        self.bias = torch.nn.Parameter(logits.clone())
        self.config = SimpleNamespace(max_position_embeddings=context)

    def forward(self, input_ids, attention_mask=None):
        return SimpleNamespace(logits=self.bias.expand(*input_ids.shape, -1))


def test_uniform_model_scores_log2_vocab_bits_per_character():
    tok = make_char_tokenizer()
    out = bits_per_byte(FixedLogits(torch.zeros(len(tok))), tok, TEXT, window=50)
    # one token per ASCII character: every byte costs log2(V) bits, in every window
    assert out["bpb"] == pytest.approx(math.log2(len(tok)))
    assert out["bytes"] == len(TEXT) and out["tokens"] == len(TEXT)
    assert out["windows"] == math.ceil(len(TEXT) / 50)
    lo, hi = out["interval"]
    assert lo == pytest.approx(out["bpb"]) and hi == pytest.approx(out["bpb"])


def test_a_model_whose_logits_favour_the_text_scores_fewer_bits():
    tok = make_char_tokenizer()
    counts = torch.full((len(tok),), 0.01)
    for i in tok(TEXT, add_special_tokens=False)["input_ids"]:
        counts[i] += 1
    uniform = bits_per_byte(FixedLogits(torch.zeros(len(tok))), tok, TEXT)
    unigram = bits_per_byte(FixedLogits(counts.log()), tok, TEXT)
    assert unigram["bpb"] < uniform["bpb"] - 1.0
    change = bpb_change(unigram, uniform)
    assert change["delta"] == pytest.approx(unigram["bpb"] - uniform["bpb"])
    assert change["interval"][1] < 0  # fewer bits on every window, so the whole interval is below 0


def test_tiny_model_bpb_is_finite_deterministic_and_windows_cover_every_byte():
    tok = make_char_tokenizer()
    model = make_tiny_llama(tok)  # max_position_embeddings 256: windows of at most 255 tokens
    text = (
        TEXT + "caf\u00e9 na\u00efve \u2014 d\u00e9j\u00e0 vu\n"
    )  # characters outside the vocabulary, several bytes each
    a, b = bits_per_byte(model, tok, text), bits_per_byte(model, tok, text)
    assert math.isfinite(a["bpb"]) and a["bpb"] > 0
    assert a["window_bits"] == b["window_bits"] and a["bpb"] == b["bpb"]
    assert a["window_tokens"] == 255 and a["bytes"] == len(text.encode("utf-8"))
    assert sum(nb for _, nb in windows(tok, text, 7)) == len(text.encode("utf-8"))
    # batching does not change a window's bits (right padding comes after every scored token)
    c = bits_per_byte(model, tok, text, batch=1)
    assert c["window_bits"] == pytest.approx(a["window_bits"], rel=1e-5)


def test_clean_text_drops_the_gutenberg_frame_and_joins_lines():
    raw = (
        "header\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\nProduced by Someone\n\n[Note: an aside.]\n\n"
        "One _two_\nthree.\n\nFour five.\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nlicence"
    )
    assert clean_text(raw) == "One two three.\n\nFour five.\n"


def test_the_shipped_text_is_the_public_domain_story():
    pytest.importorskip("reasoning_gym")
    text, info = retention_text()
    assert 25_000 < info["characters"] < 40_000 and info["bytes"] == len(text.encode("utf-8"))
    assert "public domain" in info["license"] and "Gutenberg" not in text and "twenty-ninth" in text


def test_corp_eval_retention_writes_a_loadable_report_with_the_change_from_base(tmp_path):
    pytest.importorskip("reasoning_gym")
    tok = make_char_tokenizer()
    dirs = []
    for seed in (0, 1):
        d = tmp_path / f"m{seed}"
        make_tiny_llama(tok, seed=seed).save_pretrained(d)
        tok.save_pretrained(d)
        dirs.append(d)
    args = ["eval", "--retention", "--model", str(dirs[1]), "--base", str(dirs[0]), "--task", "arith"]
    args += ["--retention-tasks", "countdown:numbers=2,max=20", "--n-test", "3", "--n-support", "0"]
    args += ["--n-probe", "0", "--n-validation", "0", "--max-new-tokens", "2", "--backend", "hf"]
    res = CliRunner().invoke(app, [*args, "--run-dir", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "r" / "retention.json").read_text())
    tasks = ["arith", "countdown:numbers=2,max=20"]
    for label in ("model", "base"):
        m = rep["models"][label]
        assert math.isfinite(m["bpb"]["bpb"]) and list(m["tasks"]) == tasks
        assert all(len(t["correct"]) == 3 and len(t["example_ids"]) == 3 for t in m["tasks"].values())
    assert rep["models"]["model"]["weights_hash"] != rep["models"]["base"]["weights_hash"]
    assert rep["change"]["bpb"]["delta"] == pytest.approx(
        rep["models"]["model"]["bpb"]["bpb"] - rep["models"]["base"]["bpb"]["bpb"]
    )
    assert set(rep["change"]["tasks"]) == set(tasks) and "public domain" in rep["text"]["license"]
    assert "change from base" in res.output
    res = CliRunner().invoke(app, ["eval", "--base", str(dirs[0]), "--model", str(dirs[1])])
    assert res.exit_code != 0 and "--retention" in res.output


def test_bpb_change_refuses_other_windows():
    a = {"bpb": 1.0, "window_bits": [1.0], "window_bytes": [8]}
    b = {"bpb": 1.0, "window_bits": [1.0], "window_bytes": [9]}
    with pytest.raises(CorpError, match="different windows"):
        bpb_change(a, b)
