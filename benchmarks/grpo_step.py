"""Seconds per GRPO optimizer step: corp's GRPO core vs TRL's `trl.GRPOTrainer`, side by side.

One process builds both trainers on the same model (two fp32 copies loaded from the same
directory), the same support prompts of the task (arith by default; TRL gets them as a
`datasets.Dataset` of conversational prompts, so it applies the chat template as our hf backend
does), and the same settings: prompts per step x num_generations completions, max completion
length, temperature 1.0 (top_k 0, top_p 1), learning rate, beta 0, loss_type dapo, 1 iteration,
grad-norm clip 1.0, AdamW with weight decay 0 (TRL: `optim='adamw_torch'`, constant lr), LoRA
(r, alpha, same target modules, dropout 0) or full-parameter (`--lora-r 0`), fp32 on CPU,
torch threads set with `torch.set_num_threads` for both. Reward: the task's correctness check
(our `compute_rewards`; TRL gets it as a `(completions, **kwargs)` reward function).
TRL's gradient checkpointing (its default) is off unless `--trl-gradient-checkpointing`: our core
does not checkpoint, so the default compares the same work.

The two are interleaved step by step: TRL's `Trainer.train()` drives the loop; a
`TrainerCallback` records `time.perf_counter()` at `on_step_begin` / `on_step_end` (TRL
generates, scores, computes the loss, backpropagates, clips and steps the optimizer in between),
and right after TRL's `on_step_end` our `GRPOTrainer.train_step()` runs and is timed the same
way (it too samples, scores, backpropagates and steps). The first `--warmup` steps of each are
not timed. Completions stop at EOS, so a step's work depends on what was sampled: each step's
mean completion length (tokens, EOS included, both sides) is recorded, and seconds per generated
token are reported next to seconds per step.

    python benchmarks/grpo_step.py --warmup 1 --steps 4 --out results/grpo-step

(develop on a tiny model: `--model /path/to/tiny-hf-dir --warmup 1 --steps 2`)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="alias or HF directory (default: the embedded model)")
    ap.add_argument("--task", default="arith")
    ap.add_argument("--n-support", type=int, default=64, help="support prompts both draw from")
    ap.add_argument("--prompts-per-step", type=int, default=4)
    ap.add_argument("--num-generations", type=int, default=4)
    ap.add_argument("--max-completion-length", type=int, default=24)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--learning-rate", type=float, default=1e-5)
    ap.add_argument("--lora-r", type=int, default=16, help="0: full-parameter training")
    ap.add_argument("--lora-alpha", type=int, default=32)
    ap.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps of each trainer first")
    ap.add_argument("--steps", type=int, default=4, help="timed steps of each trainer")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--trl-gradient-checkpointing",
        action="store_true",
        help="TRL's default; off by default (our core does not checkpoint)",
    )
    ap.add_argument("--out", default=None, help="directory for README.md (table + command) and timings.json")
    return ap.parse_args()


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    args = parse_args()
    os.environ.setdefault("CORP_NO_PROGRESS", "1")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning)

    import datasets
    import transformers
    import trl
    from transformers import TrainerCallback

    from corp.algorithms.grpo.trainer import GRPOConfig as OurConfig
    from corp.algorithms.grpo.trainer import GRPOTrainer as OurTrainer
    from corp.config import load_config
    from corp.evaluate.rewards import compute_rewards
    from corp.runtime.context import setup_run
    from corp.runtime.models import load_model

    load_start = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="corp-bench-grpo-"))
    total = args.warmup + args.steps

    # ---------------------------------------------------------------- ours
    ours_cfg = load_config(
        OurConfig,
        None,
        {
            "model": args.model,
            "task": args.task,
            "backend": "hf",
            "n_support": args.n_support,
            "n_probe": 0,
            "n_validation": 0,
            "n_test": 0,
            "max_new_tokens": args.max_completion_length,
            "steps": total,
            "prompts_per_step": args.prompts_per_step,
            "num_generations": args.num_generations,
            "temperature": args.temperature,
            "learning_rate": args.learning_rate,
            "beta": 0.0,
            "loss": "grpo",
            "loss_type": "dapo",
            "num_iterations": 1,
            "grad_accum": 1,
            "lora_r": args.lora_r,
            "lora_alpha": args.lora_alpha,
            "lora_targets": args.lora_targets,
            "threads": args.threads,
            "seed": args.seed,
            "skip_test_eval": True,
            "run_dir": str(tmp / "ours"),
        },
    )
    ctx = setup_run(ours_cfg, "bench-grpo", needs=("support",))
    ours = OurTrainer(ctx, ours_cfg)
    support = ctx.splits["support"]
    task = ctx.task
    model_path = str(ctx.backend.model_path)

    # ---------------------------------------------------------------- TRL
    model, tokenizer, _, _ = load_model(model_path)
    model = model.float()
    ds = datasets.Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": e.prompt}] for e in support], "idx": list(range(len(support)))}
    )

    def task_correct(completions, idx, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        rewards, _ = compute_rewards(task, texts, [support[i] for i in idx], None)
        return rewards

    n_seq = args.prompts_per_step * args.num_generations
    trl_args = trl.GRPOConfig(
        output_dir=str(tmp / "trl"),
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        bf16=False,
        fp16=False,
        per_device_train_batch_size=n_seq,
        gradient_accumulation_steps=1,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        temperature=args.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        optim="adamw_torch",
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        loss_type="dapo",
        num_iterations=1,
        scale_rewards="group",
        epsilon=0.2,
        max_steps=total,
        seed=args.seed,
        gradient_checkpointing=args.trl_gradient_checkpointing,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    peft_config = None
    if args.lora_r > 0:
        from peft import LoraConfig

        targets = [t.strip() for t in args.lora_targets.split(",") if t.strip()]
        peft_config = LoraConfig(
            r=args.lora_r,
            lora_alpha=args.lora_alpha,
            target_modules=targets,
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
        )

    rec = {"trl": [], "ours": [], "trl_logs": []}

    class Interleave(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            assert torch.get_num_threads() == args.threads
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            rec["trl"].append({"step": state.global_step, "seconds": time.perf_counter() - self.t0})
            t = time.perf_counter()
            row = ours.train_step()
            sec = time.perf_counter() - t
            rec["ours"].append(
                {
                    "step": row["step"],
                    "seconds": sec,
                    "completion_len": row["completion_len"],
                    "reward": row["reward"],
                    "loss": row["loss"],
                }
            )
            print(
                f"step {state.global_step}: trl {rec['trl'][-1]['seconds']:.2f}s "
                f" ours {sec:.2f}s (len {row['completion_len']:.1f})",
                file=sys.stderr,
                flush=True,
            )

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                rec["trl_logs"].append(
                    {"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}}
                )

    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=task_correct,
        args=trl_args,
        train_dataset=ds,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[Interleave()],
    )
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # logs go to timings.json, not stdout
    torch.set_num_threads(args.threads)
    n_train = {
        "ours": sum(p.numel() for _, p in ours.trainable),
        "trl": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
    }
    trainer.train()

    logs = {r["step"]: r for r in rec["trl_logs"]}
    for r in rec["trl"]:
        lg = logs.get(r["step"], {})
        r["completion_len"] = lg.get("completions/mean_length", float("nan"))
        r["reward"] = lg.get("reward", float("nan"))
        r["loss"] = lg.get("loss", float("nan"))

    summary = {}
    for name in ("ours", "trl"):
        timed = rec[name][args.warmup :]
        sec = [r["seconds"] for r in timed]
        tok = [r["completion_len"] * n_seq for r in timed]
        summary[name] = {
            "median_s_per_step": med(sec),
            "min_s": min(sec),
            "max_s": max(sec),
            "mean_completion_len": statistics.mean(r["completion_len"] for r in timed),
            "mean_generated_tokens_per_step": statistics.mean(tok),
            "median_s_per_generated_token": med([s / t for s, t in zip(sec, tok)]),
            "trainable_params": n_train[name],
        }
    ratio_step = summary["ours"]["median_s_per_step"] / summary["trl"]["median_s_per_step"]
    ratio_tok = summary["ours"]["median_s_per_generated_token"] / summary["trl"]["median_s_per_generated_token"]
    cmd = "python benchmarks/grpo_step.py " + " ".join(sys.argv[1:])
    mode = (
        f"LoRA r={args.lora_r} alpha={args.lora_alpha} on {args.lora_targets}" if args.lora_r > 0 else "full-parameter"
    )
    head = (
        f"model `{args.model}` ({ctx.backend.n_params / 1e6:.1f}M params, fp32), task {args.task} ({len(support)} "
        f"support prompts), {mode}; {args.prompts_per_step} prompts x {args.num_generations} generations per step, max "
        f"completion length {args.max_completion_length}, temperature {args.temperature}, lr {args.learning_rate}, "
        f"beta 0, loss_type dapo, 1 iteration, grad accum 1; CPU, torch threads {args.threads}; TRL gradient "
        f"checkpointing {'on' if args.trl_gradient_checkpointing else 'off'}. {args.warmup} warm-up + {args.steps} "
        "timed steps each, interleaved (TRL step k, then our step k); medians over the timed steps."
    )
    lines = [
        "| trainer | s / step (median) | min - max | mean completion length (tokens) | generated tokens / step | s / "
        "generated token (median) | trainable params |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in (("ours", "corp GRPO core"), ("trl", f"TRL {trl.__version__} GRPOTrainer")):
        s = summary[name]
        lines.append(
            f"| {label} | {s['median_s_per_step']:.2f} | {s['min_s']:.2f} - {s['max_s']:.2f} | "
            f"{s['mean_completion_len']:.1f} | {s['mean_generated_tokens_per_step']:.0f} | "
            f"{s['median_s_per_generated_token'] * 1e3:.1f} ms | {s['trainable_params']:,} |"
        )
    lines += [
        "",
        f"ratio ours / TRL: **{ratio_step:.2f}** per step, **{ratio_tok:.2f}** per generated token (target: <= 1).",
    ]
    table = "\n".join(lines)
    print(head + "\n\n" + table)

    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        load = (
            f"load average (1/5/15 min) at start {'/'.join(f'{x:.2f}' for x in load_start)}, at end "
            f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        env = (
            f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, datasets "
            f"{datasets.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs (shared; {load})"
        )
        per_step = ["| step | TRL s | TRL mean len | our s | our mean len |", "|---|---|---|---|---|"]
        for i, (t, o) in enumerate(zip(rec["trl"], rec["ours"])):
            per_step.append(
                f"| {i + 1}{' (warm-up)' if i < args.warmup else ''} | {t['seconds']:.2f} | {t['completion_len']:.1f} "
                f"| {o['seconds']:.2f} | {o['completion_len']:.1f} |"
            )
        readme = "\n".join(
            [
                "# GRPO step time: corp GRPO core vs TRL GRPOTrainer",
                "",
                "```bash",
                cmd,
                "```",
                "",
                head,
                "",
                table,
                "",
                "Per step:",
                "",
                *per_step,
                "",
                "A step is timed from TRL's `on_step_begin` to `on_step_end` (generation, reward, loss, "
                "backward, clip, optimizer step) and around our `GRPOTrainer.train_step()` (the same "
                "stages). Completion lengths include the EOS token on both sides; `generated tokens / step` "
                "= mean completion length x sequences per step. Sampling is random on both sides, so the "
                "two trainers do not generate the same completions; seconds per generated token corrects "
                "for length only roughly (prompt work and the optimizer step do not scale with it).",
                "",
                f"Environment: {env}. Raw timings: `timings.json`.",
                "",
            ]
        )
        (out / "README.md").write_text(readme)
        (out / "timings.json").write_text(
            json.dumps(
                {
                    "command": cmd,
                    "args": vars(args),
                    "summary": summary,
                    "ratio_s_per_step": ratio_step,
                    "ratio_s_per_generated_token": ratio_tok,
                    "sequences_per_step": n_seq,
                    **rec,
                },
                indent=1,
            )
        )
        print(f"wrote {out / 'README.md'}", file=sys.stderr)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
