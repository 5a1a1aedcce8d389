"""The backend contract (corp/runtime/backends/base.py): what every backend has, the capabilities
only some have, and one error line (naming the backend) when a caller needs one that is missing."""

from __future__ import annotations

import pytest
import torch

from corp.algorithms.perturb import Direction, weights_hash
from corp.config import load_config
from corp.errors import CorpError
from corp.runtime.backends.base import CAPABILITIES, LOGPROBS, PERTURBER, Backend
from corp.runtime.backends.hf import HFBackend, format_prompt
from corp.runtime.models import save_model
from tests.conftest import make_char_tokenizer, make_tiny_llama


class EngineLike(Backend):
    """A backend that keeps its weights out of process (as vLLM and the Ray driver do): it
    generates and sets directions through another backend, and declares no capability."""

    name = "engine"

    def __init__(self, inner: HFBackend):
        self.inner = inner
        self.model_id, self.n_params, self.weights_hash = "engine-model", inner.n_params, inner.weights_hash
        self.tokenizer = inner.tokenizer  # a backend may have a tokenizer without the `model` capability

    def generate(self, *args, **kwargs):
        return self.inner.generate(*args, **kwargs)

    def set_direction(self, direction):
        self.inner.set_direction(direction)


def test_hf_backend_has_every_capability_and_the_contract_attributes(tiny_backend, tmp_path):
    assert all(tiny_backend.supports(c) for c in CAPABILITIES)
    assert tiny_backend.model_id is None, "an in-memory model: the caller names it"
    assert tiny_backend.weights_hash == weights_hash(tiny_backend.model)
    tok = make_char_tokenizer()
    save_model(make_tiny_llama(tok), tok, tmp_path / "m")
    loaded = HFBackend.from_model_name(str(tmp_path / "m"), batch_size=4)
    assert loaded.model_id == str((tmp_path / "m").resolve()) and loaded.n_params == tiny_backend.n_params
    with pytest.raises(ValueError, match="unknown backend capability"):
        tiny_backend.supports("gpu")


def test_weights_hash_is_of_the_base_even_with_a_specialist_applied(tiny_model, tiny_tokenizer):
    base = weights_hash(tiny_model)
    backend = HFBackend(tiny_model, tiny_tokenizer, batch_size=8)
    backend.set_direction(Direction.single(3, 0.1))
    perturbed = weights_hash(tiny_model)
    assert perturbed != base
    assert backend.weights_hash == base, "hashing the applied specialist would key the run by the wrong weights"
    assert weights_hash(tiny_model) == perturbed, "the specialist is still applied afterwards"


def test_a_backend_without_capabilities_says_so_in_one_line(tiny_backend):
    engine = EngineLike(tiny_backend)
    assert not any(engine.supports(c) for c in CAPABILITIES)
    for attr in ("perturber", "model"):
        with pytest.raises(CorpError, match=r"the 'engine' backend does not provide; pass --backend hf"):
            getattr(engine, attr)
    with pytest.raises(CorpError, match=CAPABILITIES[LOGPROBS]):
        engine.logprobs(["1 + 1"], [[5]])
    with pytest.raises(CorpError, match=r"^corp es needs corp's in-process Perturber"):
        engine.require(PERTURBER, "corp es")
    assert engine.tokenizer is tiny_backend.tokenizer and engine.weights_hash == tiny_backend.weights_hash

    class Forgetful(Backend):
        name = "forgetful"

    with pytest.raises(NotImplementedError, match="weights_hash"):
        _ = Forgetful().weights_hash


def reference_logprobs(backend: HFBackend, prompt: str, completion: list[int], temperature: float = 1.0) -> list[float]:
    """One unpadded sequence through the model: log_softmax(logits / T) at each completion token."""
    tok = backend.tokenizer
    ids = tok(format_prompt(tok, prompt), add_special_tokens=False)["input_ids"]
    full = torch.tensor([ids + completion])
    with torch.no_grad():
        logits = backend.model(input_ids=full).logits[0].float() / temperature
    logsm = torch.log_softmax(logits, -1)
    return [float(logsm[len(ids) - 1 + t, c]) for t, c in enumerate(completion)]


def test_logprobs_match_an_unpadded_forward_and_follow_the_direction(tiny_backend):
    prompts = ["12 + 7 =", "3+4", "what is 100 + 250?"]  # different lengths: the batch is padded
    gens = tiny_backend.generate(prompts, max_new_tokens=6)
    completions = [ids if ids else [5] for ids in gens.token_ids]
    got = tiny_backend.logprobs(prompts, completions)
    for p, c, lp in zip(prompts, completions, got):
        assert lp == pytest.approx(reference_logprobs(tiny_backend, p, c), abs=1e-5)
    # greedy completions: each generated token was the most likely one, so its log-prob is the max
    tok = tiny_backend.tokenizer
    ids = tok(format_prompt(tok, prompts[0]), add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = tiny_backend.model(input_ids=torch.tensor([ids + gens.token_ids[0]])).logits[0]
    maxes = torch.log_softmax(logits.float(), -1).max(-1).values[len(ids) - 1 : len(ids) - 1 + len(gens.token_ids[0])]
    assert got[0] == pytest.approx(maxes.tolist(), abs=1e-5)
    assert tiny_backend.logprobs(prompts, completions, temperature=2.0)[1] == pytest.approx(
        reference_logprobs(tiny_backend, prompts[1], completions[1], 2.0), abs=1e-5
    )
    tiny_backend.set_direction(Direction.single(1, 0.5))
    moved = tiny_backend.logprobs(prompts, completions)
    assert moved[0] != pytest.approx(got[0], abs=1e-4), "log-probs are taken under the current weights"
    tiny_backend.set_direction(None)
    assert tiny_backend.logprobs(prompts, completions) == got
    assert tiny_backend.logprobs(["x"], [[]]) == [[]]


def test_methods_that_need_a_capability_stop_with_one_line(tmp_path, tiny_backend):
    """consolidate once died with an AttributeError on a backend without a Perturber (only
    --low-rank was checked); es and grpo checked by hand. All three now ask the contract."""
    from corp.methods.consolidate.run import ConsolidateConfig, run_consolidate
    from corp.methods.es import ESConfig, run_es

    common = dict(task="arith", n_support=4, n_test=2, max_new_tokens=4)
    cfg = load_config(
        ConsolidateConfig,
        None,
        dict(common, population=2, sigmas="0.05", n_probe=2, n_validation=2, top_k="1", run_dir=str(tmp_path / "c")),
    )
    with pytest.raises(
        CorpError, match=r"corp consolidate .* the 'engine' backend does not provide; pass --backend hf"
    ):
        run_consolidate(cfg, EngineLike(tiny_backend))
    cfg = load_config(ESConfig, None, dict(common, iterations=1, population=2, run_dir=str(tmp_path / "e")))
    with pytest.raises(CorpError, match=r"corp es .* the 'engine' backend does not provide"):
        run_es(cfg, EngineLike(tiny_backend))
