"""ES under low-rank noise (`--noise lowrank:r=R`, issue 26): each update is a sum of N rank-R terms
per weight matrix, norms and biases never move, the recipe rebuilds the model, and a run is resumed
only under the scheme it was made with."""

from __future__ import annotations

import pytest
import torch

from corp.algorithms.perturb import Direction, Perturber, scheme_from_flag
from corp.config import load_config
from corp.errors import CorpError
from corp.methods.es import ESConfig, run_es
from corp.runtime.backends.hf import HFBackend
from corp.runtime.runs import read_json
from tests.conftest import make_char_tokenizer, make_tiny_llama

POPULATION = 4


def _cfg(run_dir, noise: str, **kw):
    opts = dict(
        task="arith",
        reward="tests.test_methods:text_checksum",  # varied rewards: members' fitness differ, so the centre moves
        n_support=6,
        n_probe=0,
        n_validation=0,
        n_test=3,
        max_new_tokens=4,
        iterations=1,
        population=POPULATION,
        sigma=0.05,
        alpha=0.05,
        skip_centre_eval=True,
        noise=noise,
        batch_size=16,
        run_dir=str(run_dir),
    )
    opts.update(kw)
    return load_config(ESConfig, None, opts)


def _update(run_dir, noise: str) -> tuple[dict[str, torch.Tensor], dict, torch.nn.Module]:
    """({parameter name: centre after one iteration - base}, the report, the trained model) of a tiny model."""
    tok = make_char_tokenizer()
    backend = HFBackend(make_tiny_llama(tok), tok, batch_size=16, scheme=scheme_from_flag(noise))
    report = run_es(_cfg(run_dir, noise), backend)
    base = dict(make_tiny_llama(tok).named_parameters())  # the base, rebuilt from its seed
    trained = backend.model  # holds the final centre (what ES saved)
    return {n: p.detach().float() - base[n].detach().float() for n, p in trained.named_parameters()}, report, trained


def _rank(m: torch.Tensor) -> int:
    s = torch.linalg.svdvals(m.double())
    return int((s > 1e-4 * s[0]).sum()) if float(s[0]) > 0 else 0


def test_lowrank_es_update_has_rank_at_most_population_times_r(tmp_path):
    """Planted: full-rank noise, same seeds and steps, moves every matrix with (near) full rank, so
    the bound below fails for it; under lowrank:r=1 every matrix's update has rank <= N x 1 and 1-D
    parameters do not move."""
    low, rep, trained = _update(tmp_path / "low", "lowrank:r=1")
    full, _, _ = _update(tmp_path / "full", "full")
    matrices = [n for n, d in low.items() if d.dim() == 2]
    assert matrices and all(min(low[n].shape) > POPULATION for n in matrices)  # the bound is below full rank
    assert any(float(d.abs().max()) > 0 for d in low.values()), "the centre did not move: the rank check proves nothing"
    for n in matrices:
        assert 1 <= _rank(low[n]) <= POPULATION * 1, (n, _rank(low[n]))
        assert _rank(full[n]) > POPULATION, (n, _rank(full[n]))  # the plant: full-rank noise breaks the bound
    for n, d in low.items():
        if d.dim() == 1:
            assert torch.count_nonzero(d) == 0, n  # no noise on norms and biases under the low-rank scheme
    # the scheme is in the recipe, and the recipe rebuilds the trained model bit for bit
    recipe = read_json(tmp_path / "low" / "recipe.json")
    scheme = scheme_from_flag("lowrank:r=1")
    assert recipe["noise_scheme"] == scheme and rep["iterations"] == 1
    assert read_json(tmp_path / "low" / "population_meta.json")["noise_scheme"] == scheme
    tok = make_char_tokenizer()
    base = make_tiny_llama(tok)
    Perturber(base, scheme=scheme).apply(Direction.from_json(recipe["components"]))
    want = dict(trained.named_parameters())
    assert all(torch.equal(p, want[n]) for n, p in base.named_parameters())


def test_a_backend_built_for_other_noise_is_refused(tmp_path):
    """A ready backend whose Perturber materialises full-rank noise, given to a lowrank:r=1 run: one
    line before anything is scored (its rows would carry the low-rank key and full-rank weights)."""
    tok = make_char_tokenizer()
    with pytest.raises(CorpError, match="the backend materialises corp-noise-v2") as err:
        run_es(_cfg(tmp_path / "r", "lowrank:r=1"), HFBackend(make_tiny_llama(tok), tok, batch_size=16))
    assert "\n" not in str(err.value) and not (tmp_path / "r" / "population.jsonl").exists()


def test_resuming_under_another_noise_is_one_line(tmp_path):
    """An ES run made under lowrank:r=1, resumed with more iterations under full-rank noise (or another
    rank): one error line naming the scheme, no traceback, nothing of the run lost."""
    from typer.testing import CliRunner

    from corp.cli import app

    tok = make_char_tokenizer()
    model_dir = tmp_path / "tiny"
    make_tiny_llama(tok).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    run = tmp_path / "run"
    args = [
        "es",
        "--model",
        str(model_dir),
        "--task",
        "arith",
        "--reward",
        "tests.test_methods:text_checksum",
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
        "--population-per-iteration",
        "2",
        "--sigma",
        "0.05",
        "--learning-rate",
        "0.05",
        "--skip-centre-eval",
        "--output-dir",
        str(run),
    ]
    res = CliRunner().invoke(app, [*args, "--iterations", "1", "--noise", "lowrank:r=1"])
    assert res.exit_code == 0, res.output
    state = (run / "es_state.json").read_text()
    rows = (run / "population.jsonl").read_text()
    for other in ("full", "lowrank:r=2"):
        res = CliRunner().invoke(app, [*args, "--iterations", "2", "--noise", other])
        assert res.exit_code != 0
        lines = [x for x in res.output.strip().splitlines() if x.strip() and not x.startswith("run directory")]
        assert len(lines) == 1 and lines[0].startswith("error:") and "noise_scheme" in lines[0], res.output
        assert scheme_from_flag(other) in lines[0] and "Traceback" not in res.output
        assert (run / "es_state.json").read_text() == state and (run / "population.jsonl").read_text() == rows
    # the same scheme resumes
    res = CliRunner().invoke(app, [*args, "--iterations", "2", "--noise", "lowrank:r=1"])
    assert res.exit_code == 0, res.output
    assert read_json(run / "es_state.json")["iteration"] == 2
