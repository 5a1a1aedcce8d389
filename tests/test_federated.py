"""Federated machinery and federated CoRP (corp fedcorp): aggregation on hand-made numbers, the
client split's errors, what clients send (asserted on the messages), a client lost mid-round, and
the command end to end on a tiny random model."""

from __future__ import annotations

import json
import math

import pytest
import torch

from corp.algorithms.aggregation import (
    ema_update,
    fedavg_weights,
    fgrpo_weights,
    relative_gains,
    softmax_weights,
    weighted_sum,
)
from corp.errors import ClientLost, CorpError
from corp.evaluate.tasks import Example
from corp.methods.fedcorp.combine import combine_client_rewards
from corp.runtime.clients import check_signatures, decode, encode, split_clients

# ---------------------------------------------------------------- aggregation, by hand


def test_fgrpo_weights_on_hand_made_rewards_and_baselines():
    # gains: (0.5 - 0.25) / 0.25 = 1, (0.2 - 0.4) / 0.4 = -0.5; no history yet: 0
    assert relative_gains([0.5, 0.2, 0.7], [0.25, 0.4, None]) == pytest.approx([1.0, -0.5, 0.0])
    w = fgrpo_weights([0.5, 0.2], [0.25, 0.4], tau=1.0)
    e1, e2 = math.exp(1.0), math.exp(-0.5)
    assert w == pytest.approx([e1 / (e1 + e2), e2 / (e1 + e2)])
    # tau sharpens: at tau 0.1 the improving client takes almost everything
    assert fgrpo_weights([0.5, 0.2], [0.25, 0.4], tau=0.1)[0] > 0.999
    # the first round (no baselines) is uniform
    assert fgrpo_weights([0.9, 0.1, 0.3], [None, None, None], tau=1.0) == pytest.approx([1 / 3] * 3)
    assert ema_update(None, 0.4) == 0.4 and ema_update(0.25, 0.5, 0.9) == pytest.approx(0.275)
    # huge gains do not overflow
    assert softmax_weights([1e6, 0.0], 1e-3) == pytest.approx([1.0, 0.0])
    with pytest.raises(CorpError, match="--tau"):
        softmax_weights([1.0], 0.0)


def test_fedavg_equals_the_data_weighted_mean():
    d1 = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([[3.0]])}
    d2 = {"a": torch.tensor([5.0, -2.0]), "b": torch.tensor([[7.0]])}
    w = fedavg_weights([1, 3])
    assert w == [0.25, 0.75]
    out = weighted_sum([d1, d2], w)
    assert torch.allclose(out["a"], (1 * d1["a"] + 3 * d2["a"]) / 4) and torch.allclose(
        out["b"], (1 * d1["b"] + 3 * d2["b"]) / 4
    )
    with pytest.raises(CorpError, match="different tensors"):
        weighted_sum([d1, {"a": d2["a"]}], [0.5, 0.5])


def test_combined_mean_reward_is_the_pooled_mean():
    # client 0: 2 examples, client 1: 6; specialist i's pooled mean = (2 r0 + 6 r1) / 8
    r = [[0.5, 1.0], [0.0, 0.5]]
    assert combine_client_rewards(r, [2, 6], [0.0, 0.0], "mean") == pytest.approx(
        [(2 * 0.5 + 0) / 8, (2 * 1.0 + 6 * 0.5) / 8]
    )
    # gain: relative to each client's own base
    g = combine_client_rewards(r, [2, 6], [0.25, 0.5], "gain")
    assert g == pytest.approx([0.25 * (0.25 / 0.25) + 0.75 * (-0.5 / 0.5), 0.25 * (0.75 / 0.25) + 0.75 * 0.0])


# ---------------------------------------------------------------- the client split


def _ex(i, expr, answer):
    return Example(id=f"e{i}", prompt=f"What is {expr}?", answer=str(answer), columns={"expression": expr})


def test_split_by_operator_is_non_iid_and_empty_shares_are_one_error():
    exs = [_ex(0, "1 + 2", 3), _ex(1, "5 - 2", 3), _ex(2, "2 * 3", 6), _ex(3, "4 + 4", 8)]
    shares = split_clients(exs, 3, "op")
    assert [[e.id for e in s] for s in shares] == [["e2"], ["e0", "e3"], ["e1"]]  # keys sorted: *, +, -
    with pytest.raises(CorpError, match="client 3 gets no support examples.*--split-by op gives 3 group"):
        split_clients(exs, 4, "op")
    with pytest.raises(CorpError, match="needs a task whose examples carry an arithmetic expression"):
        split_clients([Example(id="x", prompt="p", answer="1")], 1, "op")
    assert [len(s) for s in split_clients(exs, 2, "iid")] == [2, 2]


def test_mismatched_task_signatures_are_one_error():
    a, b = {"name": "arith", "ops": "+"}, {"name": "arith", "ops": "*"}
    assert check_signatures([a, dict(a)]) == a
    with pytest.raises(
        CorpError, match="client 1 holds task .*every client of one run must hold the same task signature"
    ):
        check_signatures([a, b])


def test_messages_round_trip_and_tensor_messages_load_without_pickled_code():
    msg = {"op": "x", "rewards": [0.5], "n": 3}
    assert decode(encode(msg)) == msg and encode(msg).startswith(b"{")
    t = {"delta": {"w": torch.ones(2)}, "reward": 0.1}
    back = decode(encode(t))
    assert torch.equal(back["delta"]["w"], torch.ones(2)) and back["reward"] == 0.1


# ---------------------------------------------------------------- fedcorp on a tiny model


def _cfg(tiny_dir, run_dir, **kw):
    from corp.config import load_config
    from corp.methods.fedcorp.run import FedCorpConfig

    opts = {
        "model": str(tiny_dir),
        "task": "arith",
        "reward": "tests.test_methods:text_checksum",
        "seed": 1,
        "population": 4,
        "sigmas": "0.05",
        "alphas": "1,2",
        "clients": 2,
        "split_by": "iid",
        "n_support": 4,
        "n_probe": 4,
        "n_validation": 4,
        "n_test": 4,
        "max_new_tokens": 4,
        "run_dir": str(run_dir),
        "gate_z": -10.0,
        **kw,
    }
    return load_config(FedCorpConfig, None, opts)


ALLOWED_UP = {
    "hello": {"signature", "n_support", "n_probe", "n_validation"},
    "score": {"rewards", "base", "n", "tokens"},
    "probe": {"rewards", "base", "n", "tokens"},
    "gate": {"accept", "n", "mean_gain", "lcb", "tokens"},
}


def _scalars_only(obj):
    """Every leaf is a number, bool or None (no text, no ids, no tensors)."""
    if isinstance(obj, dict):
        return all(_scalars_only(v) for v in obj.values())
    if isinstance(obj, list):
        return all(_scalars_only(v) for v in obj)
    return obj is None or isinstance(obj, (bool, int, float))


def test_fedcorp_clients_send_only_rewards_and_verdicts(tiny_dir, tmp_path):
    from corp.methods.fedcorp.run import run_fedcorp

    log = []
    report = run_fedcorp(_cfg(tiny_dir, tmp_path / "run"), log=lambda k, d, m: log.append((k, d, m)))
    ids = [
        e for s in json.loads((tmp_path / "run" / "splits.json").read_text()).values() if isinstance(s, list) for e in s
    ]
    last_down = {}
    for k, direction, msg in log:
        if direction == "down":
            last_down[k] = msg["op"]
            continue
        op = last_down[k]
        assert set(msg) == ALLOWED_UP[op], (op, msg)
        if op == "hello":
            assert set(msg["signature"]) >= {"name"} and _scalars_only(
                {k2: v for k2, v in msg.items() if k2 != "signature"}
            )
        else:
            assert _scalars_only(msg), msg
        text = json.dumps(msg)
        assert not any(i in text for i in ids) and "What is" not in text
    ops = [m["op"] for _, d, m in log if d == "down"]
    assert ops.count("score") == 2 and ops.count("gate") == 2 and ops.count("probe") >= 2
    # the server combined exactly what the clients sent: data-weighted mean (iid: 2 + 2 examples)
    cr = report["client_rewards"]
    assert report["combined_rewards"] == pytest.approx([(a + b) / 2 for a, b in zip(cr["0"], cr["1"])])
    assert report["total_bytes"] == sum(p["total_bytes"] for p in report["communication"].values()) > 0
    assert report["accepted"] and set(report["verdicts"]) == {"0", "1"}
    assert json.loads((tmp_path / "run" / "recipe.json").read_text())["kind"] == "corp-direction"


def _count_backends(monkeypatch) -> list:
    """The models RunContexts load (the server's and any client's), one entry per load."""
    from corp.runtime.context import run_context

    built, real = [], run_context.make_backend

    def counted(*args, **kwargs):
        built.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(run_context, "make_backend", counted)
    return built


def _outcome(run, report) -> dict:
    """What a fedcorp run decided and wrote, timings left out: the report's rows and client tables,
    the recipe, and every evaluation's rewards and completions (the server's and each client's)."""
    fields = ("table", "accepted", "candidate", "verdicts", "client_rewards", "combined_rewards", "probe_table")
    evals = {
        str(p.relative_to(run)): [(r["key"], r["rewards"], r["completion_hashes"]) for r in map(json.loads, p.open())]
        for p in sorted(run.rglob("evals.jsonl"))
    }
    more = ("per_client_test_accuracy", "communication")
    return {
        **{f: report[f] for f in fields + more},
        "recipe": json.loads((run / "recipe.json").read_text()),
        "evals": evals,
    }


def test_fedcorp_local_clients_score_with_the_runs_model(tiny_dir, tmp_path, monkeypatch):
    """--executor local loads the model once: the clients score with the server's backend (each loaded
    its own before, K + 1 models: 2 clients of the 1.5B model in float32 held 18 GB the memory check
    did not count), and the run decides and writes what it did with a copy per client."""
    from safetensors.torch import load_file

    from corp.methods.fedcorp import run as fedcorp

    built = _count_backends(monkeypatch)
    shared = fedcorp.run_fedcorp(_cfg(tiny_dir, tmp_path / "shared"))
    assert len(built) == 1, built
    real = fedcorp.CorpClient.__init__
    monkeypatch.setattr(fedcorp.CorpClient, "__init__", lambda self, *a: real(self, *a[:4]))  # a model each
    own = fedcorp.run_fedcorp(_cfg(tiny_dir, tmp_path / "own"))
    assert len(built) == 1 + 3  # the planted case: the server and both clients load one
    assert shared["accepted"] and len(_outcome(tmp_path / "own", own)["evals"]) == 3
    assert _outcome(tmp_path / "shared", shared) == _outcome(tmp_path / "own", own)
    saved, again = (load_file(next((tmp_path / r / "model").glob("*.safetensors"))) for r in ("shared", "own"))
    assert saved.keys() == again.keys() and all(torch.equal(saved[k], again[k]) for k in saved)


def test_fedcorp_clients_leave_no_merged_direction_in_the_runs_model(tiny_dir, tmp_path, monkeypatch):
    """The merged candidate a client gated stays built in the shared Perturber (one fp32 copy of the
    weights); when the run abstains, the server's test rows and saved model never apply it: freed."""
    from corp.algorithms.perturb.direction import Merged
    from corp.methods.fedcorp import run as fedcorp

    gate, outputs, seen = fedcorp.CorpClient.op_gate, fedcorp._fedcorp_outputs, {}

    def rejects(self, msg):  # every client vetoes, after gating the candidate on its own share
        reply = gate(self, msg)
        seen.setdefault("at gate", []).append(len(self._context()[0].backend.perturber._kept))
        return {**reply, "accept": False}

    def spy(cfg, ctx, out, direction, *rest):
        seen["merged"] = any(isinstance(t, Merged) for t in out.best.direction.components)
        seen["kept"] = dict(ctx.backend.perturber._kept)
        return outputs(cfg, ctx, out, direction, *rest)

    monkeypatch.setattr(fedcorp.CorpClient, "op_gate", rejects)
    monkeypatch.setattr(fedcorp, "_fedcorp_outputs", spy)
    report = fedcorp.run_fedcorp(_cfg(tiny_dir, tmp_path / "run"))
    assert not report["accepted"] and seen["merged"] and seen["at gate"] == [1, 1]  # the planted case
    assert seen["kept"] == {}


def test_fedcorp_a_client_lost_mid_round_is_dropped_and_the_round_completes(tiny_dir, tmp_path, monkeypatch):
    from corp.methods.fedcorp import run as fedcorp

    real = fedcorp.CorpClient.op_probe

    def dies(self, msg):
        if self.index == 1:
            raise ClientLost("process killed (test)")
        return real(self, msg)

    monkeypatch.setattr(fedcorp.CorpClient, "op_probe", dies)
    report = fedcorp.run_fedcorp(_cfg(tiny_dir, tmp_path / "run"))
    assert set(report["dropped_clients"]) == {"1"} and "probe" in report["dropped_clients"]["1"]
    assert set(report["verdicts"]) == {"0"}  # the gate asked only the client still alive
    assert report["communication"]["gate"]["per_client"].keys() == {"0"}


def test_fedcorp_every_client_lost_is_one_error(tiny_dir, tmp_path, monkeypatch):
    from corp.methods.fedcorp import run as fedcorp

    def dies(self, msg):
        raise ClientLost("gone")

    monkeypatch.setattr(fedcorp.CorpClient, "op_score", dies)
    with pytest.raises(CorpError, match="population: every client was lost"):
        fedcorp.run_fedcorp(_cfg(tiny_dir, tmp_path / "run"))


def test_fedcorp_a_client_with_another_task_is_refused(tiny_dir, tmp_path, monkeypatch):
    from corp.methods.fedcorp import run as fedcorp

    real = fedcorp.CorpClient.op_hello

    def other(self, msg):
        out = real(self, msg)
        if self.index == 1:
            out["signature"] = {**out["signature"], "ops": "*"}
        return out

    monkeypatch.setattr(fedcorp.CorpClient, "op_hello", other)
    with pytest.raises(CorpError, match="same task signature"):
        fedcorp.run_fedcorp(_cfg(tiny_dir, tmp_path / "run"))


def test_fedcorp_cli_end_to_end_and_empty_share_error(tiny_dir, tmp_path):
    from typer.testing import CliRunner

    from corp.algorithms.recipe import apply_recipe
    from corp.cli import app

    run = tmp_path / "run"
    args = [
        "fedcorp",
        "--model",
        str(tiny_dir),
        "--task",
        "arith",
        "--reward",
        "tests.test_methods:text_checksum",
        "--population",
        "4",
        "--sigmas",
        "0.05",
        "--alphas",
        "1,2",
        "--clients",
        "2",
        "--split-by",
        "iid",
        "--n-support",
        "4",
        "--n-probe",
        "4",
        "--n-validation",
        "4",
        "--n-test",
        "4",
        "--max-completion-length",
        "4",
        "--gate-z",
        "-10",
        "--output-dir",
        str(run),
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "communication:" in res.output
    rebuilt = apply_recipe(run / "recipe.json", tmp_path / "rebuilt")
    from safetensors.torch import load_file

    saved = load_file(next((run / "model").glob("*.safetensors")))
    again = load_file(next(__import__("pathlib").Path(rebuilt).glob("*.safetensors")))
    assert all(torch.equal(saved[k], again[k]) for k in saved)
    # arith's default ops are '+' only: one operator group for 2 clients
    bad = CliRunner().invoke(app, args[:-2] + ["--split-by", "op", "--output-dir", str(tmp_path / "bad")])
    assert (
        bad.exit_code != 0
        and "error: client 1 gets no support examples" in bad.output
        and len(bad.output.strip().splitlines()) == 1
    ), bad.output
    assert not (tmp_path / "bad").exists()  # nothing half-written
