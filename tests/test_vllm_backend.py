"""The vllm backend against the hf reference on the embedded model (runs where vLLM is installed:
`make test-vllm`, in .venv-vllm; skipped elsewhere).

Agreement: for the base and two sigma=1e-3 specialists, greedy completions on 32 arith prompts
are identical on >= 95% of prompts, and the summed rewards differ by at most 1 (one example), with
every difference printed. Exactness: applying a direction changes the engine's weights exactly to
base + direction (a fused qkv_proj read back through the extension equals the hf tensors
concatenated), and restoring makes them bit-identical to before.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from corp.algorithms.perturb import Component, Direction, specialist_seeds  # noqa: E402
from corp.evaluate.tasks import SplitSizes, get_task, make_splits  # noqa: E402
from corp.runtime.backends.hf import HFBackend  # noqa: E402

pytestmark = pytest.mark.embedded


@pytest.fixture(scope="module")
def vllm_backend():
    from corp.runtime.backends.vllm import VLLMBackend

    b = VLLMBackend.from_model_name(None)
    yield b
    b.close()


@pytest.fixture(scope="module")
def hf_backend():
    return HFBackend.from_model_name(None, batch_size=32)


def test_greedy_agreement_with_hf(vllm_backend, hf_backend):
    task = get_task("arith")
    examples = make_splits(task, SplitSizes(32, 0, 0, 0), 0)["support"]
    prompts = [e.prompt for e in examples]
    s1, s2 = specialist_seeds(0, 2)
    failures = []
    for label, direction in (
        ("base", None),
        (f"seed {s1}", Direction.single(s1, 1e-3)),
        (f"seed {s2}", Direction.single(s2, 1e-3)),
    ):
        hf_backend.set_direction(direction)
        vllm_backend.set_direction(direction)
        g_hf = hf_backend.generate(prompts, task.max_new_tokens)
        g_vl = vllm_backend.generate(prompts, task.max_new_tokens)
        assert g_hf.prompt_tokens == g_vl.prompt_tokens, "prompt tokens counted after the same chat template"
        same = [a == b for a, b in zip(g_hf.texts, g_vl.texts)]
        for i, ok in enumerate(same):
            if ok:
                assert g_hf.generated_tokens[i] == g_vl.generated_tokens[i], (
                    f"{label} #{i}: same text, different token count"
                )
            else:
                print(f"[{label}] prompt {i} differs:\n  hf:   {g_hf.texts[i]!r}\n  vllm: {g_vl.texts[i]!r}")
        r_hf = sum(float(task.check(task.extract(t), e)) for t, e in zip(g_hf.texts, examples))
        r_vl = sum(float(task.check(task.extract(t), e)) for t, e in zip(g_vl.texts, examples))
        print(
            f"[{label}] identical {sum(same)}/32, reward hf {r_hf:.0f} "
            f"vllm {r_vl:.0f}, apply {vllm_backend.last_apply_seconds:.2f}s"
        )
        if sum(same) < 0.95 * len(same) or abs(r_hf - r_vl) > 1:
            failures.append(f"{label}: identical {sum(same)}/32, rewards {r_hf} vs {r_vl}")
    hf_backend.set_direction(None)
    vllm_backend.set_direction(None)
    assert not failures, failures


def test_apply_is_exact_and_restore_bit_identical(vllm_backend, hf_backend):
    vllm_backend.set_direction(None)
    before = vllm_backend.fingerprint()
    qkv_before = vllm_backend.read_linear("model.layers.0.self_attn.qkv_proj")
    direction = Direction.single(12345, 1e-3)
    vllm_backend.set_direction(direction)
    perturbed = vllm_backend.fingerprint()
    assert perturbed != before
    # the fused tensor the engine computes with == base + direction in HF naming, concatenated
    base = hf_backend.perturber.base
    expected = torch.cat(
        [
            direction.add_to(
                base[f"model.layers.0.self_attn.{p}_proj.weight"].to(torch.float32, copy=True),
                f"model.layers.0.self_attn.{p}_proj.weight",
            )
            for p in "qkv"
        ]
    )
    got = vllm_backend.read_linear("model.layers.0.self_attn.qkv_proj")
    assert got.dtype == torch.float32 and torch.equal(got, expected)
    assert not torch.equal(got, qkv_before)
    # the tied LM head computes with the perturbed embedding too, as in the hf backend
    emb = "model.embed_tokens.weight"
    assert torch.equal(
        vllm_backend.read_linear("lm_head"), direction.add_to(base[emb].to(torch.float32, copy=True), emb)
    )
    vllm_backend.set_direction(None)
    assert vllm_backend.fingerprint() == before, "restore is bit-exact"
    assert torch.equal(vllm_backend.read_linear("model.layers.0.self_attn.qkv_proj"), qkv_before)


def test_a_merged_term_is_built_once_and_pushed_at_every_scale_with_the_same_bits(
    vllm_backend, hf_backend, monkeypatch
):
    """A step search's pushes (one merged term at several scales) read M back from the worker's file
    after the first: no noise drawn again, and the engine's weights are base + direction as add_to
    builds them (corp.algorithms.perturb.merged_files)."""
    import corp.algorithms.perturb.merged_files as mf

    built = []
    real = mf.materialise
    monkeypatch.setattr(mf, "materialise", lambda *a, **k: built.append(a[1]) or real(*a, **k))
    m = Direction.merged([Component(s, 1e-3, c) for s, c in [(11, 0.5), (7, -0.25), (123, 1.0), (5, 0.125)]])
    vllm_backend.set_direction(m.scaled(4.0))
    first = vllm_backend.fingerprint()
    n_built = len(built)
    assert n_built == len(hf_backend.perturber.params)  # once per selected tensor
    vllm_backend.set_direction(m.scaled(1.0))
    vllm_backend.set_direction(m.scaled(4.0))
    assert len(built) == n_built, "a term already kept draws no noise"
    assert vllm_backend.fingerprint() == first
    name = "model.layers.0.self_attn.q_proj.weight"
    want = m.scaled(4.0).add_to(hf_backend.perturber.base[name].to(torch.float32, copy=True), name)
    got = vllm_backend.read_linear("model.layers.0.self_attn.qkv_proj")[: want.shape[0]]
    assert torch.equal(got, want)
    files = vllm_backend.llm.collective_rpc(lambda worker: worker._corp_merged.kept())[0]
    assert len(files) == 1 and Path(files[0]).exists()
    vllm_backend.set_direction(None)


def test_population_meta_matches_hf(vllm_backend, hf_backend):
    from corp.algorithms.perturb import weights_hash

    assert vllm_backend.weights_hash == weights_hash(hf_backend.model)
    assert vllm_backend.n_params == hf_backend.n_params


def test_sampling_is_seeded_per_completion(vllm_backend):
    """Same seeds -> same samples, other seeds -> other samples, and a prompt's samples do not
    depend on the other prompts of its call (each completion is its own seeded request)."""
    vllm_backend.set_direction(None)
    task = get_task("arith")
    prompts = [e.prompt for e in make_splits(task, SplitSizes(6, 0, 0, 0), 0)["support"]]
    seeds = [101, 202, 303, 404, 505, 606]
    one = vllm_backend.generate(prompts, 24, temperature=1.0, n=2, seeds=seeds).texts
    assert vllm_backend.generate(prompts, 24, temperature=1.0, n=2, seeds=seeds).texts == one
    alone = vllm_backend.generate(prompts[2:3], 24, temperature=1.0, n=2, seeds=seeds[2:3]).texts
    assert alone == one[4:6]
    rev = vllm_backend.generate(prompts[::-1], 24, temperature=1.0, n=2, seeds=seeds[::-1]).texts
    assert [t for i in range(len(prompts) - 1, -1, -1) for t in rev[2 * i : 2 * i + 2]] == one
    other = vllm_backend.generate(prompts, 24, temperature=1.0, n=2, seeds=[s + 1 for s in seeds]).texts
    assert other != one


def test_seeded_sampling_of_more_prompt_tokens_than_one_engine_step_takes(vllm_backend):
    """bench-cpu-3's self-consistency (400 prompts x 8 seeded samples) crashed in vLLM: after a chunked
    prefill it rolls a seeded request's generator back with set_offset, which CPU generators lack.
    Planted: 200 seeded requests of about 46 prompt tokens, more than one step's token budget."""
    vllm_backend.set_direction(None)
    task = get_task("arith")
    prompts = [e.prompt for e in make_splits(task, SplitSizes(100, 0, 0, 0), 0)["support"]]
    out = vllm_backend.generate(prompts, 2, temperature=0.7, n=2, seeds=list(range(100, 200)))
    assert len(out.texts) == 200 and sum(out.prompt_tokens) > 8192
