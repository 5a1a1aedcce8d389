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


def _two_tiny_models(tmp_path):
    """Two tiny models that differ only in their initialisation seed (a model and its base)."""
    tok = make_char_tokenizer()
    dirs = []
    for seed in (0, 1):
        d = tmp_path / f"m{seed}"
        make_tiny_llama(tok, seed=seed).save_pretrained(d)
        tok.save_pretrained(d)
        dirs.append(d)
    return dirs


def test_corp_eval_retention_writes_a_loadable_report_with_the_change_from_base(tmp_path):
    pytest.importorskip("reasoning_gym")
    dirs = _two_tiny_models(tmp_path)
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


# ------------------------------------------------------------------ several texts (`--retention-texts`, issue 55)


def test_several_texts_pool_every_window_and_report_each_text(tmp_path):
    """Planted: a short and a long text, so a pooled figure that averaged the texts' bits per byte (instead of
    summing bits over bytes) would differ from the bytes-weighted one checked here."""
    pytest.importorskip("reasoning_gym")
    short, long = tmp_path / "short.txt", tmp_path / "long.txt"
    short.write_text("zebra quartz jinx.\n\n" * 3)
    long.write_text(TEXT * 4)
    m0, m1 = _two_tiny_models(tmp_path)
    args = ["eval", "--retention", "--model", str(m1), "--base", str(m0), "--task", "arith", "--n-test", "2"]
    args += ["--n-support", "0", "--n-probe", "0", "--n-validation", "0", "--max-new-tokens", "2", "--backend", "hf"]
    args += ["--retention-texts", f"verne-2889,{short},{long}", "--run-dir", str(tmp_path / "r")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "r" / "retention.json").read_text())
    assert [t["name"] for t in rep["texts"]] == ["verne-2889", str(short), str(long)]
    assert rep["text"]["bytes"] == sum(t["bytes"] for t in rep["texts"]) and rep["text"]["title"].startswith("3 texts")
    for label in ("model", "base"):
        m = rep["models"][label]
        parts = m["bpb_by_text"].values()
        weighted = sum(p["bpb"] * p["bytes"] for p in parts) / sum(p["bytes"] for p in parts)
        assert m["bpb"]["bpb"] == pytest.approx(weighted, rel=1e-9)
        assert m["bpb"]["bpb"] != pytest.approx(sum(p["bpb"] for p in parts) / 3, rel=1e-3)  # not the plain mean
        assert m["bpb"]["windows"] == sum(p["windows"] for p in parts)
    per = rep["change"]["bpb_by_text"]
    assert set(per) == {"verne-2889", str(short), str(long)}
    for name, ch in per.items():
        mine, theirs = rep["models"]["model"]["bpb_by_text"][name], rep["models"]["base"]["bpb_by_text"][name]
        assert ch["delta"] == pytest.approx(mine["bpb"] - theirs["bpb"])
    assert f"{short}: bpb" in res.output and "change from base:   verne-2889" in res.output


@pytest.mark.parametrize(
    "texts, fragment",
    [
        ("verne-2889,no-such-text", "neither one of corp's texts"),
        ("verne-2889,verne-2889", "names a text twice"),
        (",", "names no text"),
    ],
)
def test_bad_retention_texts_are_one_line_before_any_model(texts, fragment, tmp_path):
    res = CliRunner().invoke(
        app, ["eval", "--retention", "--retention-texts", texts, "--model", str(tmp_path / "none")]
    )
    assert res.exit_code == 2 and fragment in res.output and "Traceback" not in res.output, res.output
    res = CliRunner().invoke(app, ["eval", "--retention-texts", "verne-2889,x", "--model", str(tmp_path / "none")])
    assert res.exit_code == 2 and "add --retention" in res.output, res.output


def test_a_known_text_missing_or_of_another_edition_is_refused(tmp_path, monkeypatch):
    """Planted: a Devil's Dictionary file whose text differs by one word from the edition corp pins."""
    import gzip

    from corp.evaluate.retention import TEXTS, known_text

    monkeypatch.setenv("CORP_CACHE", str(tmp_path))
    import dataclasses

    only_cache = dataclasses.replace(TEXTS["bierce-devils-dictionary"], files=("texts/devil.dict.dz",))
    monkeypatch.setitem(TEXTS, "bierce-devils-dictionary", only_cache)  # not the machine's installed package
    with pytest.raises(CorpError, match="not on this machine: `make retention-texts`"):
        known_text("bierce-devils-dictionary")
    (tmp_path / "texts").mkdir()
    body = "header\n\nABASEMENT, n.  A decent and customary mental attitude.\n\nABATIS, n.  Rubbish.\n"
    (tmp_path / "texts" / "devil.dict.dz").write_bytes(gzip.compress(body.encode()))
    with pytest.raises(CorpError, match="another edition"):
        known_text("bierce-devils-dictionary")


def test_the_debian_texts_are_the_pinned_editions_and_fifty_thousand_tokens_with_the_default():
    """The two texts `make retention-texts` fetches: read, cleaned and pinned (known_text checks the sha256),
    and with the default text at least 50,000 tokens for the embedded model's tokenizer (issue 55's floor)."""
    from corp.evaluate.retention import TEXTS, known_text, texts_of

    try:
        got = texts_of(["verne-2889", *TEXTS])
    except CorpError as exc:
        if "not on this machine" not in str(exc):
            raise
        pytest.skip(f"the Debian texts are not here ({exc}); `make retention-texts` fetches them")
    assert [i["name"] for _, i in got] == ["verne-2889", *TEXTS]
    assert "public domain" in known_text("jargon-file")[1]["license"]
    from transformers import AutoTokenizer

    from corp.runtime.models import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m")[1])
    assert sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t, _ in got) >= 50_000
