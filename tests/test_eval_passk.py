"""`corp eval`: pass@k over problems equals the closed form; the command runs end to end through the CLI."""

from __future__ import annotations

import functools
import json
from math import comb

import pytest
from typer.testing import CliRunner

from corp.cli import app
from corp.config import load_config
from corp.errors import CorpError
from corp.evaluate.passk import EvalConfig, pass_at_k_table
from tests.conftest import make_char_tokenizer, make_tiny_llama


def test_pass_at_k_table_is_the_closed_form_mean():
    n = 4
    correct = [1, 0, 0, 0] + [1, 1, 0, 1] + [0, 0, 0, 0]
    table = pass_at_k_table([bool(c) for c in correct], n, [1, 2, 4])
    for k in (1, 2, 4):
        expected = sum(1 - comb(n - c, k) / comb(n, k) for c in (1, 3, 0)) / 3
        assert table[k] == pytest.approx(expected)


def test_eval_config_rejects_k_above_n():
    with pytest.raises(CorpError, match="--num-generations"):
        load_config(EvalConfig, None, {"pass_k": "1,8", "n_samples": 4})


def test_corp_eval_cli_on_saved_tiny_model(tmp_path):
    tok = make_char_tokenizer()
    model_dir = tmp_path / "m"
    make_tiny_llama(tok).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    res = CliRunner().invoke(
        app,
        [
            "eval",
            "--model",
            str(model_dir),
            "--task",
            "arith",
            "--n-test",
            "3",
            "--n-support",
            "0",
            "--n-probe",
            "0",
            "--n-validation",
            "0",
            "--pass-k",
            "1,2",
            "--num-generations",
            "3",
            "--max-completion-length",
            "4",
            "--output-dir",
            str(tmp_path / "run"),
        ],
    )
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert set(report["pass_at_k"]) == {"1", "2"} and 0 <= report["greedy_accuracy"] <= 1
    assert report["pass_at_k"]["1"] <= report["pass_at_k"]["2"]
    assert report["ledger"]["generated_tokens"] > 0


def _eval(tmp_path, *args):
    return CliRunner().invoke(
        app,
        [
            "eval",
            "--model",
            str(tmp_path / "m"),
            "--task",
            "arith",
            "--n-test",
            "4",
            "--batch-size",
            "2",
            "--max-completion-length",
            "2",
            "--output-dir",
            str(tmp_path / "run"),
            *args,
        ],
    )


def test_corp_eval_is_greedy_accuracy_by_default_with_a_progress_bar(tmp_path, monkeypatch, capsys):
    """No --pass-k: greedy accuracy only (one completion per problem, no sampling); a bar counts the
    completions, batch by batch on hf, and is off under CORP_NO_PROGRESS=1."""
    from transformers.generation.utils import GenerationMixin

    from corp.evaluate import passk

    tok = make_char_tokenizer()
    make_tiny_llama(tok).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    assert load_config(EvalConfig).pass_k == []
    calls = []
    real = GenerationMixin.generate
    monkeypatch.setattr(GenerationMixin, "generate", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    monkeypatch.delenv("CORP_NO_PROGRESS", raising=False)
    monkeypatch.setattr(passk, "tqdm", functools.partial(passk.tqdm, mininterval=0))  # draw every update
    res = _eval(tmp_path)
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["pass_at_k"] == {} and "pass@" not in res.output and "greedy accuracy" in res.output
    assert len(calls) == 2, "two greedy batches of 2 problems, nothing sampled"
    shown = capsys.readouterr().err + res.output
    assert "eval:  50%" in shown and "eval: 100%" in shown and "4/4" in shown
    monkeypatch.setenv("CORP_NO_PROGRESS", "1")
    res = _eval(tmp_path, "--pass-k", "1,2")  # asked for: sampled too (the greedy pass is reused)
    assert res.exit_code == 0, res.output
    assert "pass@2" in res.output and len(calls) == 2 + 4  # 4 problems x 2 samples, in batches of 2
    assert "eval:" not in capsys.readouterr().err + res.output
