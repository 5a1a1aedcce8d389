"""FGRPO (corp fgrpo) on a tiny random model: what clients send (asserted on the messages), the
aggregation applied to the real updates (FedAvg = data-weighted mean; fgrpo = softmax of relative
gains), a client lost mid-round, and the command end to end through the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from corp.errors import ClientLost, CorpError


def _cfg(tiny_dir, run_dir, **kw):
    from corp.config import load_config
    from corp.methods.fgrpo import FGRPOConfig

    opts = {
        "model": str(tiny_dir),
        "task": "arith",
        "reward": "tests.test_methods:text_checksum",
        "seed": 1,
        "rounds": 2,
        "steps": 1,
        "clients": 2,
        "split_by": "iid",
        "prompts_per_step": 2,
        "num_generations": 2,
        "lora_r": 2,
        "learning_rate": 1e-2,
        "n_support": 6,
        "n_probe": 0,
        "n_validation": 0,
        "n_test": 4,
        "max_new_tokens": 4,
        "run_dir": str(run_dir),
        **kw,
    }
    return load_config(FGRPOConfig, None, opts)


def _record(log):
    return lambda k, d, m: log.append(
        (
            k,
            d,
            {key: ({n: t.clone() for n, t in v.items()} if key in ("delta", "state") else v) for key, v in m.items()},
        )
    )


@pytest.mark.parametrize("aggregation", ["fedavg", "fgrpo"])
def test_clients_send_only_updates_and_scalars_and_the_server_aggregates_them(tiny_dir, tmp_path, aggregation):
    from corp.algorithms.aggregation import fgrpo_weights
    from corp.methods.fgrpo import run_fgrpo

    log = []
    # iid over 6 support examples with 2 clients would give equal sizes; 5 makes FedAvg's weights unequal (3 and 2)
    report = run_fgrpo(_cfg(tiny_dir, tmp_path / "run", aggregation=aggregation, n_support=5), log=_record(log))
    ids = json.loads((tmp_path / "run" / "splits.json").read_text())["support"]
    ups = [(k, m) for k, d, m in log if d == "up" and "delta" in m]
    downs = [(k, m) for k, d, m in log if d == "down" and m["op"] == "round"]
    assert len(ups) == 4 and len(downs) == 4
    for _k, m in ups:
        assert set(m) == {"delta", "reward", "n_examples", "tokens"}, m.keys()
        assert all(isinstance(t, torch.Tensor) and "lora_" in n for n, t in m["delta"].items())  # LoRA factors only
        assert isinstance(m["reward"], float) and isinstance(m["n_examples"], int)
        assert set(m["tokens"]) == {"prompt_tokens", "generated_tokens", "trained_tokens"} and all(
            isinstance(v, int) for v in m["tokens"].values()
        )
        assert not any(i in json.dumps({x: m[x] for x in ("reward", "n_examples", "tokens")}) for i in ids)
    assert {n for n in ups[0][1]["delta"]} == set(downs[0][1]["state"])
    # round 2's global = round 1's global + sum_k alpha_k Delta_k, with the method's own weights
    g1, g2 = downs[0][1]["state"], downs[2][1]["state"]
    r1 = [m for _, m in ups[:2]]
    if aggregation == "fedavg":
        w = [m["n_examples"] / sum(x["n_examples"] for x in r1) for m in r1]
        assert sorted(m["n_examples"] for m in r1) == [2, 3]
    else:
        w = fgrpo_weights([m["reward"] for m in r1], [None, None], 1.0)  # first round: no baselines, uniform
    assert report["rounds"][0]["weights"] == pytest.approx(w)
    for n in g1:
        assert torch.allclose(g2[n], g1[n] + sum(wk * m["delta"][n] for wk, m in zip(w, r1)), atol=1e-6), n
    assert any(not torch.equal(g2[n], g1[n]) for n in g1), "no update: the aggregation check proved nothing"
    # round 2 (fgrpo): the weights come from each client's relative gain over its round-1 reward
    if aggregation == "fgrpo":
        r2 = [m["reward"] for _, m in ups[2:]]
        assert report["rounds"][1]["weights"] == pytest.approx(fgrpo_weights(r2, [m["reward"] for m in r1], 1.0))
    assert report["bytes_per_round"][0] == report["rounds"][0]["communication"]["total_bytes"] > 0
    assert report["method_ledger"]["trained_tokens"] > 0 and len(report["rounds"][0]["client_test_accuracy"]) == 2


def test_a_client_lost_mid_round_is_dropped_and_the_round_completes(tiny_dir, tmp_path, monkeypatch):
    from corp.methods import fgrpo

    real = fgrpo.FGRPOClient.op_round

    def dies(self, msg):
        if self.index == 1 and msg["round"] == 1:
            raise ClientLost("process killed (test)")
        return real(self, msg)

    monkeypatch.setattr(fgrpo.FGRPOClient, "op_round", dies)
    report = fgrpo.run_fgrpo(_cfg(tiny_dir, tmp_path / "run"))
    assert [r["clients"] for r in report["rounds"]] == [[0, 1], [0]]
    assert report["rounds"][1]["weights"] == [1.0]
    assert set(report["dropped_clients"]) == {"1"} and "round 2" in report["dropped_clients"]["1"]


def test_bad_options_are_one_error(tiny_dir, tmp_path):
    with pytest.raises(CorpError, match="--aggregation 'mean'"):
        _cfg(tiny_dir, tmp_path / "r", aggregation="mean")
    with pytest.raises(CorpError, match="--tau"):
        _cfg(tiny_dir, tmp_path / "r", tau=0)


def test_fgrpo_cli_end_to_end_and_empty_share_error(tiny_dir, tmp_path):
    from typer.testing import CliRunner

    from corp.cli import app

    run = tmp_path / "run"
    args = [
        "fgrpo",
        "--model",
        str(tiny_dir),
        "--task",
        "arith",
        "--reward",
        "tests.test_methods:text_checksum",
        "--rounds",
        "1",
        "--local-steps",
        "1",
        "--clients",
        "2",
        "--split-by",
        "iid",
        "--prompts-per-step",
        "2",
        "--num-generations",
        "2",
        "--lora-r",
        "2",
        "--aggregation",
        "fedavg",
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
        str(run),
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads((run / "report.json").read_text())
    assert report["method"] == "fgrpo" and len(report["rounds"]) == 1 and (run / "model" / "config.json").exists()
    bad = CliRunner().invoke(app, args[:-2] + ["--split-by", "op", "--output-dir", str(tmp_path / "bad")])
    assert (
        bad.exit_code != 0
        and "error: client 1 gets no support examples" in bad.output
        and len(bad.output.strip().splitlines()) == 1
    ), bad.output
    assert not (tmp_path / "bad").exists()
