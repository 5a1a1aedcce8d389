"""FERA (corp/methods/fera.py): the server's uncertainty weights and vote, a scripted fake model
where the confident client must win a conflict the plain vote loses, and the command end to end."""

from __future__ import annotations

import json
import math

import pytest

from corp.config import load_config
from corp.errors import CorpError
from corp.methods.fera import FERAConfig, client_answer, client_weights, plain_vote, run_fera, synthesise
from corp.runtime.backends.base import Backend, Generations
from tests.conftest import make_char_tokenizer, make_tiny_llama


def test_weights_are_softmax_of_negative_uncertainty():
    w = client_weights([0.0, 0.5, 1.0], 0.5)
    z = [math.exp(0), math.exp(-1), math.exp(-2)]
    assert w == pytest.approx([v / sum(z) for v in z])
    assert client_answer(["3", "3", "4", None]) == ("3", 0.5)
    assert client_answer([None, None]) == (None, 1.0)


def test_confident_minority_wins_and_ties_go_to_the_least_uncertain():
    answers, unc = ["7", "8", "8"], [0.0, 0.5, 0.5]
    assert plain_vote(answers) == "8"
    assert synthesise(answers, unc, 0.1)[0] == "7"  # w = (0.987, 0.0067, 0.0067)
    assert synthesise(answers, unc, 10.0)[0] == "8"  # a large T is nearly the plain vote
    assert synthesise(["5", "6"], [0.3, 0.3], 1.0)[0] == "5" and synthesise(["5", "6"], [0.3, 0.2], 1e9)[0] == "6"
    assert synthesise([None, "4"], [0.0, 0.9], 0.1)[0] == "4"  # a client without an answer abstains
    assert synthesise([None, None], [0.0, 0.0], 0.1)[0] is None


class ScriptedBackend(Backend):
    """Client c (the c-th generate call of a round) always answers from its script; records prompts."""

    name = "scripted"

    def __init__(self, scripts):
        self.scripts, self.calls = scripts, []
        self.model_id, self.n_params, self.weights_hash = "scripted", 1, "0" * 64

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, n=1, seed=None, stop=None):
        script = self.scripts[len(self.calls) % len(self.scripts)]
        self.calls.append(list(prompts))
        texts = [script[j % len(script)] for _ in prompts for j in range(n)]
        return Generations(texts, [3] * len(texts), [1] * len(texts), 0.0, [[1]] * len(texts))

    def set_direction(self, direction):
        pass


def test_confident_client_wins_a_conflict_on_a_scripted_model(tmp_path):
    # client 0 is sure of 7; clients 1 and 2 lean to 8 but disagree with themselves half the time
    backend = ScriptedBackend([["7", "7", "7", "7"], ["8", "8", "1", "2"], ["8", "3", "8", "4"]])
    cfg = load_config(
        FERAConfig,
        None,
        {
            "model": "scripted",
            "task": "arith",
            "clients": 3,
            "shots": 1,
            "rounds": 2,
            "samples": 4,
            "temperature_u": 0.1,
            "n_support": 3,
            "n_probe": 0,
            "n_validation": 0,
            "n_test": 5,
            "run_dir": str(tmp_path / "run"),
        },
    )
    report = run_fera(cfg, backend=backend)
    rows = [json.loads(x) for x in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    for r in rows:
        assert r["synthesis"] == ["7"] * 5 and r["plain_vote"] == ["8"] * 5
        assert [u[0] for u in r["client_uncertainty"]] == [0.0, 0.5, 0.5]
        assert r["mean_weights"][0] > 0.98
    assert len(backend.calls) == 6  # 3 clients x 2 rounds
    assert all("combined answer last round" not in p for p in backend.calls[0])
    assert all("combined answer last round: 7" in p for p in backend.calls[3])  # the synthesis goes back as context
    # each client's prompt holds its own demonstration only (private shares)
    demos = [{line for line in backend.calls[c][0].splitlines() if line.startswith("Question:")} for c in range(3)]
    assert len(set.union(*demos)) == 3 + 1
    assert [r["round"] for r in report["rounds"]] == [1, 2]
    # resume: the rounds are read back, nothing generated
    again = run_fera(cfg, backend=backend)
    assert len(backend.calls) == 6 and again["rows"] == report["rows"]


def test_client_with_too_small_a_share_is_one_line(tmp_path):
    cfg = load_config(
        FERAConfig,
        None,
        {
            "model": "scripted",
            "task": "arith",
            "clients": 4,
            "shots": 2,
            "n_support": 5,
            "n_test": 2,
            "run_dir": str(tmp_path / "r"),
        },
    )
    with pytest.raises(CorpError, match="client 1 holds 1 support examples, fewer than --shots 2"):
        run_fera(cfg, backend=ScriptedBackend([["1"]]))
    assert not (tmp_path / "r").exists()
    with pytest.raises(CorpError, match="--uncertainty"):
        load_config(FERAConfig, None, {"uncertainty": "vibes"})


def test_corp_fera_cli_end_to_end_with_entropy(tmp_path):
    from typer.testing import CliRunner

    from corp.cli import app

    tok = make_char_tokenizer()
    d = tmp_path / "m"
    make_tiny_llama(tok).save_pretrained(d)
    tok.save_pretrained(d)
    args = [
        "fera",
        "--model",
        str(d),
        "--task",
        "arith",
        "--clients",
        "2",
        "--shots",
        "1",
        "--rounds",
        "2",
        "--num-generations",
        "2",
        "--uncertainty",
        "entropy",
        "--n-support",
        "2",
        "--n-probe",
        "0",
        "--n-validation",
        "0",
        "--n-test",
        "3",
        "--max-completion-length",
        "4",
        "--output-dir",
        str(tmp_path / "run"),
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert [r["round"] for r in report["rounds"]] == [1, 2] and report["method"] == "fera"
    u = report["rounds"][0]["mean_client_uncertainty"]
    assert all(0 < x < math.log(len(tok)) + 1e-6 for x in u)  # a mean token entropy, not a disagreement share
    assert report["rounds"][1]["bytes_down"] > 0 and report["rounds"][0]["bytes_up"] > 0
