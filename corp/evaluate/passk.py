"""`corp eval`: the evaluation every method shares — greedy accuracy (and pass@k when asked) on the test split.

Greedy accuracy: one greedy completion per test problem. pass@k (`--pass-k`, none by default): n
sampled completions per problem (temperature `--temperature`), c of them correct, pass@k = mean
over problems of 1 - C(n - c, k) / C(n, k) (corp.evaluate.voting.pass_at_k, unbiased, Chen et al. 2021).
A progress bar counts the completions (off with CORP_NO_PROGRESS=1). `--retention` also scores
bits per byte on held-out text and accuracy on other tasks, beside a `--base` (corp.evaluate.retention).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar

from tqdm.auto import tqdm

from corp.algorithms.stats import PerExample
from corp.config import RunConfig, parse_list
from corp.errors import CorpError
from corp.evaluate.retention import parse_texts, retention_lines, score_retention, texts_of
from corp.evaluate.voting import pass_at_k
from corp.runtime.context import RunContext, cached_eval, run_evals
from corp.runtime.loop import Outputs, drive
from corp.runtime.models import shown_datasets
from corp.runtime.progress import progress_disabled
from corp.runtime.runs import ReportRow

NAME = "eval"  # the command and the report's method


@dataclass
class EvalConfig(RunConfig):
    pass_k: list[int] = field(default_factory=list)
    """k values for pass@k, comma-separated, e.g. 1,8,64 (default: none, greedy accuracy only; sampling n completions per problem costs n greedy passes)."""
    n_samples: int | None = None
    """n: sampled completions per problem for pass@k (default: the largest k)."""
    temperature: float = 1.0
    """Sampling temperature for pass@k."""
    retention: bool = False
    """Also score what training cost the model off its task (corp.evaluate.retention): bits per byte on held-out public-domain text and greedy accuracy on the test split of each of --retention-tasks; writes RUN_DIR/retention.json."""
    retention_tasks: str = ""
    """With --retention: task specs scored beside --task, separated by ';' (a spec may hold commas), e.g. 'arith;countdown:numbers=2'."""
    retention_texts: str = "verne-2889"
    """With --retention: the texts bits per byte is pooled over (each also reported on its own), comma-separated: corp's (verne-2889; bierce-devils-dictionary and jargon-file after `make retention-texts`) or paths to UTF-8 files."""
    base: str | None = None
    """With --retention: a model scored the same way (the base the evaluated model was trained from); the report gives the change from it with paired intervals."""

    not_options: ClassVar[tuple[str, ...]] = ("report_to",)  # no metrics rows: nothing to log
    options: ClassVar[dict[str, str]] = {"n_samples": "num_generations"}  # TRL's name for completions per prompt

    def validate(self) -> EvalConfig:
        super().validate()
        self.pass_k = sorted(set(parse_list(self.pass_k, int, "pass_k")))
        if self.pass_k and min(self.pass_k) < 1:
            raise CorpError(f"--pass-k values must be >= 1, got {self.pass_k}")
        n = self.n_samples if self.n_samples is not None else (max(self.pass_k) if self.pass_k else 0)
        if self.pass_k and n < max(self.pass_k):
            raise CorpError(
                f"--num-generations {n} is smaller than the largest --pass-k {max(self.pass_k)}; pass@k needs k <= n"
            )
        if self.pass_k and not 0 < self.temperature < math.inf:
            raise CorpError(f"--temperature must be > 0 for pass@k sampling, got {self.temperature}")
        self.n_samples = n
        texts_given = self.retention_texts != type(self).retention_texts
        if (self.retention_tasks or self.base or texts_given) and not self.retention:
            raise CorpError(
                "--retention-tasks, --retention-texts and --base are options of --retention; add --retention"
            )
        if self.retention:
            names = parse_texts(self.retention_texts)
            texts_of(names)  # a bad name, a missing file or another edition: one line, before any model loads
            self.retention_texts = ",".join(names)
        return self


def pass_at_k_table(correct: list[bool], n: int, ks: list[int]) -> dict[int, float]:
    """Mean pass@k over problems from a flat, problem-major list of n correctness flags per problem."""
    if len(correct) % n:
        raise ValueError("correctness list is not n per problem")
    counts = [sum(correct[i : i + n]) for i in range(0, len(correct), n)]
    return {k: sum(pass_at_k(n, c, k) for c in counts) / len(counts) for k in ks}


@contextmanager
def completions_bar(backend, total: int) -> Iterator[tqdm]:
    """A progress bar over `total` completions (off with CORP_NO_PROGRESS=1). A backend that generates
    batch by batch through `generate_rows` (hf) moves it per batch; one that generates in one call
    (vLLM) moves it when the caller says a pass is done (`bar.update`)."""
    bar = tqdm(
        total=total,
        desc=NAME,
        unit="completion",
        dynamic_ncols=True,
        disable=progress_disabled(),
    )
    step = getattr(type(backend), "generate_rows", None)
    counted = callable(step) and not bar.disable
    if counted:

        def generate_rows(seqs, *args, **kwargs):
            rows = step(backend, seqs, *args, **kwargs)
            bar.update(min(len(seqs), bar.total - bar.n))
            return rows

        backend.generate_rows = generate_rows
    try:
        yield bar
    finally:
        if counted:
            del backend.generate_rows
        bar.close()


def run_eval(cfg: EvalConfig, backend=None) -> dict:
    return drive(cfg, NAME, backend, lambda ctx: _eval(cfg, ctx), needs=("test",), host_copy=None)  # it only scores


def _eval(cfg: EvalConfig, ctx: RunContext) -> Outputs:
    test = ctx.splits["test"]
    # cached: a rerun on the same --output-dir (same model, examples, settings) recomputes nothing
    evals = run_evals(ctx)
    passk: dict[int, float] = {}
    with completions_bar(ctx.backend, len(test) * (1 + (cfg.n_samples if cfg.pass_k else 0))) as bar:
        greedy = cached_eval(ctx, evals, "test", None)
        bar.update(len(test) - bar.n)  # a cached pass, or a backend that does not count batches
        led = ctx.ledger().add_generation(greedy["prompt_tokens"], greedy["generated_tokens"])
        if cfg.pass_k:
            sampled = cached_eval(ctx, evals, "test", None, n=cfg.n_samples, temperature=cfg.temperature)
            bar.update(bar.total - bar.n)
            led.add_generation(sampled["prompt_tokens"], sampled["generated_tokens"])
            passk = pass_at_k_table([bool(c) for c in sampled["correct"]], cfg.n_samples, cfg.pass_k)
    ids = ctx.example_ids("test")
    pass_at = {str(k): v for k, v in passk.items()}
    row = ReportRow(
        "model",
        greedy["accuracy"],
        1,
        led,
        0,
        PerExample(greedy["correct"], ids),
        {"pass_at_k": pass_at},
        PerExample(greedy["rewards"], ids),
    )
    fields = {
        "greedy_accuracy": greedy["accuracy"],
        "n_samples": cfg.n_samples,
        "temperature": cfg.temperature,
        "pass_at_k": pass_at,
        "ledger": led.to_dict(),
    }
    kept = (  # retention.json
        score_retention(ctx, evals, cfg.retention_tasks, cfg.base, texts=cfg.retention_texts) if cfg.retention else None
    )
    lines = [
        f"{cfg.model} on {shown_datasets(cfg.task)}, {len(test)} test problems",
        # no gold answers: the greedy reward is what the run measured (accuracy would read 0)
        f"greedy reward    {row.reward:.3f}"
        if ctx.measure == "reward"
        else f"greedy accuracy  {greedy['accuracy']:.3f}",
    ]
    lines += [f"pass@{k:<10} {v:.3f}   (n={cfg.n_samples}, T={cfg.temperature})" for k, v in passk.items()]
    lines += retention_lines(kept) if kept is not None else []
    lines.append(f"run directory: {ctx.run_dir}")
    return Outputs(
        [row],
        [],
        ids,
        fields,
        table=lambda _: "\n".join(lines),
        shown={"retention": kept} if kept is not None else {},
    )
