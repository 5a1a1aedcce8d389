"""`corp grpo`: GRPO (or a loss variant) on the support split, evaluated before and after on test.

Paper and departures: the trainer's docstring (corp/algorithms/grpo/trainer.py, the core GRPO trainer that
F-TIS and FGRPO build on too); this module is the command around it: the run directory, the
evaluation cache, the saved model and the report.
"""

from __future__ import annotations

import hashlib
import json

from corp.algorithms.grpo.trainer import GRPOConfig, GRPOTrainer, drawn_positions
from corp.config import config_to_dict
from corp.method import ITERATIVE, SMALL, BenchAdapter, Method, num, opt
from corp.runtime.context import RunContext, cached_eval, eval_identity, eval_key, run_evals
from corp.runtime.loop import Outputs, drive, method_rows

NAME = "grpo"  # the command; its runs' method is NAME-LOSS (grpo-grpo, grpo-cov, grpo-reco)


def run_grpo(cfg: GRPOConfig, backend=None) -> dict:
    """Train with GRPO (or a variant), evaluate before/after on the test split, save model + report."""
    needs = ("support",) if cfg.skip_test_eval else ("support", "test")
    return drive(cfg, f"{NAME}-{cfg.loss}", backend, lambda ctx: _grpo(cfg, ctx), needs=needs)


def _grpo(cfg: GRPOConfig, ctx: RunContext) -> Outputs:
    _ = ctx.weights_hash  # the base's hash, taken before training (or a resumed checkpoint) changes the weights
    evals = run_evals(ctx)  # the shared evaluation cache (keyed by weights, examples and settings)
    trained_as = hashlib.sha256(
        json.dumps(
            {k: v for k, v in config_to_dict(cfg).items() if k not in ("run_dir", "threads", "report_to")},
            sort_keys=True,
            default=str,
        ).encode()
    ).hexdigest()[:16]

    def test_eval(key: str) -> dict | None:
        if cfg.skip_test_eval:
            return None
        # the weights as they are (never set_direction: it restores the base); named by what made them
        what = "base" if key == "base:test" else f"grpo|{key}|config={trained_as}|step={trainer.step}"
        return cached_eval(ctx, evals, "test", what=what, current=True, kind="checkpoint")

    trainer = GRPOTrainer(ctx, cfg)
    if not trainer.ckpt_path.exists():
        before = test_eval("base:test")
    else:
        before = (
            evals.get(eval_key(eval_identity(ctx.eval_context(), "base", ctx.example_ids("test"))))
            if not cfg.skip_test_eval
            else None
        )
    trainer.train()
    model = trainer.merged_model()
    trainer.backend.model = model
    after = test_eval("final:test")
    ids = ctx.example_ids("test")
    rows = method_rows(trainer.ledger.n_params, ctx.method, before, after, len(ctx.splits["support"]), ids)
    fields = {
        "steps": trainer.step,
        "lora_r": cfg.lora_r,
        "trainable_params": sum(p.numel() for _, p in trainer.trainable),
        "test_accuracy_before": before["accuracy"] if before else None,
        "test_accuracy_after": after["accuracy"] if after else None,
        "trained_tokens_note": (
            "prompt + completion tokens of every sequence in a training forward/backward; 6N per token also for LoRA"
        ),
    }
    return Outputs(
        rows,
        [(ctx.method, "base")],
        ids if rows else None,
        fields,
        trainer.ledger,
        model=(model, trainer.tokenizer),
    )


def summary(report: dict) -> str:
    lines = []
    if report.get("table"):
        lines.append(report["table"])
    elif report.get("test_accuracy_before") is not None:
        lines.append(
            f"test accuracy: base {num(report['test_accuracy_before'])} -> {report.get('method', NAME)} "
            f"{num(report.get('test_accuracy_after'))}"
        )
    led = report.get("training_ledger") or {}
    if led:
        lines.append(
            f"{report.get('steps')} steps; trained tokens {led.get('trained_tokens')}, inference tokens "
            f"{led.get('prompt_tokens', 0) + led.get('generated_tokens', 0)}, {num(led.get('flops'), '.3e')} FLOPs"
        )
    lines.append(f"model: {report.get('model_dir')}")
    return "\n".join(lines)


METHOD = Method(
    NAME,
    GRPOConfig,
    run_grpo,
    "GRPO (TRL-style) with loss variants grpo | cov | reco; full-parameter or LoRA; saves an HF model directory.",
    model=True,
    smoke={
        **SMALL,
        "steps": 2,
        "prompts_per_step": 2,
        "num_generations": 2,
        "checkpoint_every": 1,
        "learning_rate": 1e-3,
    },
    summary=summary,
    # one GRPO step generates prompts_per_step * num_generations completions (a fraction of a support pass)
    bench=BenchAdapter(
        ITERATIVE,
        r"grpo-.*",
        flops=("training_ledger.flops",),
        equal_data=True,
        unit="steps",
        units_done="steps",
        unit_evals=lambda o: (
            float(opt(o, GRPOConfig, "prompts_per_step"))
            * float(opt(o, GRPOConfig, "num_generations"))
            / max(1.0, float(opt(o, GRPOConfig, "n_support")))
        ),
        touched=lambda o, seed, units: (
            None
            if units is None
            else drawn_positions(
                "corp-grpo", seed, units, int(o.get("n_support") or 0), int(opt(o, GRPOConfig, "prompts_per_step"))
            )
        ),
        regime={"units": 100},  # issue 39: at least 100 optimizer steps at the top budget
    ),
)
