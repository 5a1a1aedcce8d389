"""`corp analyze-rank`: the split-half low-rank analysis of a scored population, as a command.

This module only wires the command: it reads the run (or scores one), finds the matrix shapes
without loading weights, runs the statistics (`corp.methods.analyze_rank.rank_stats`, whose docstring holds
the specification, docs/methods.md "Split-half low-rank analysis", and where it departs) and the power
simulation (`corp.methods.analyze_rank.power`), and writes the outputs (`corp.methods.analyze_rank.report`).

The layers below it: `linalg` (SVD helpers), `rank_stats` (statistics and the r* rule), `power`,
`report`. The low-rank helpers low-rank consolidation shares (`reproducible_ranks`,
`project_low_rank`, `low_rank_factors`) are in the core module `corp/algorithms/lowrank.py`; the others that
other code imported from here before the split (`analyze_population`, ...) are re-exported.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from corp.algorithms.perturb import ParamFilter
from corp.algorithms.perturb.noise import check_scheme
from corp.errors import CorpError
from corp.evaluate.racing import is_raced
from corp.evaluate.scorer import ensure_population
from corp.methods.analyze_rank.config import NAME
from corp.methods.analyze_rank.linalg import subspace_overlap, top_svd
from corp.methods.analyze_rank.power import analysis_power
from corp.methods.analyze_rank.rank_stats import Plan, analyze_population, pair_stats
from corp.methods.analyze_rank.report import summarise, summary_text, write_outputs
from corp.runtime.context import RunContext
from corp.runtime.loop import Outputs, drive
from corp.runtime.models import ALIASES, resolve_model
from corp.runtime.runs import read_json, read_jsonl, write_json

__all__ = [
    "Plan",
    "analyze_population",
    "model_shapes",
    "pair_stats",
    "run_analyze_rank",
    "subspace_overlap",
    "summarise",
    "summary_text",
    "top_svd",
    "write_outputs",
]


def model_shapes(model_name: str) -> tuple[str, list[tuple[str, tuple[int, ...]]], int | None]:
    """(model id, [(canonical name, shape)], vocab size) without loading weights (meta device)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_id, path = resolve_model(model_name)
    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    named = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    vocab = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", None)
    return model_id, named, vocab


def load_run_population(run_dir: Path) -> tuple[list[dict], dict, dict]:
    import yaml

    every = read_jsonl(run_dir / "population.jsonl", key="key", repair=False)
    if is_raced(every):
        raise CorpError(
            f"'{run_dir}' holds a raced population (some specialists saw only part of the support split); "
            "the split-half analysis needs every specialist scored on all of it: score a population without --race"
        )
    rows = [
        r
        for r in every
        if r.get("split", "support") == "support"
        and r.get("seed") is not None
        and r.get("kind", "specialist") == "specialist"
    ]
    rows = sorted(
        {r["key"]: r for r in rows}.values(), key=lambda r: r.get("index", 0)
    )  # population order (older files: file order)
    if not rows:
        raise CorpError(f"'{run_dir}/population.jsonl' has no scored specialists")
    meta_path = run_dir / "population_meta.json"
    meta = read_json(meta_path) if meta_path.exists() else {}
    if meta.get("kind", "population") != "population":
        raise CorpError(
            f"'{run_dir}' holds a '{meta['kind']}' run, not a population of perturbations of the base; analyse a "
            "population from `corp score`, `randopt` or `consolidate`"
        )
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.exists():
        raise CorpError(f"'{run_dir}' has no config.yaml, so its model is unknown")
    run_cfg = yaml.safe_load(cfg_path.read_text()) or {}
    return rows, meta, run_cfg


def run_analyze_rank(cfg) -> dict:
    """`corp analyze-rank`: analyse a scored population and write the outputs into its run directory
    (--from-run DIR in place; otherwise score, or take --from-run's population, into --output-dir)."""
    if cfg.run:
        run_dir = Path(cfg.run)
        rows, meta, run_cfg = load_run_population(run_dir)
        model_name = run_cfg.get("model") or meta.get("model")
        pf = meta.get("param_filter") or {
            "include": run_cfg.get("include", ".*"),
            "exclude": run_cfg.get("exclude", ""),
        }
        # a population written before the scheme was recorded predates corp-noise-v2
        scheme = check_scheme(meta.get("noise_scheme", "corp-noise-v1"), f"'{run_dir}/population_meta.json'")
        result, summary = _analyze(cfg, run_dir, rows, model_name, pf, scheme, meta.get("model"))
        # in place: the files go into a run directory this command did not open (no run of its own)
        write_outputs(run_dir, result, summary, cfg.plot_matrices)
        return {**summary, "text": summary_text(summary)}

    if getattr(cfg, "race", "off") != "off":
        raise CorpError("analyze-rank needs every specialist scored on the whole support split; drop --race")
    return drive(cfg, NAME, None, lambda ctx: _analyze_run(cfg, ctx), needs=("support",))


def _analyze_run(cfg, ctx: RunContext) -> Outputs:
    """A run of its own: score the population (or take --from-run's), analyse it; the driver writes the files."""
    rows = ensure_population(ctx)
    if is_raced(rows):
        raise CorpError(
            f"--from-run '{cfg.from_run}' holds a raced population; the split-half "
            "analysis needs every specialist scored on the whole support split"
        )
    ctx.release_backend()  # free the model: the analysis needs shapes only
    pf = {"include": cfg.include, "exclude": cfg.exclude}
    result, summary = _analyze(cfg, ctx.run_dir, rows, cfg.model, pf, ctx.noise_scheme, None)
    return Outputs(
        [],
        [],
        None,
        {**summary, "text": summary_text(summary)},
        exports=[lambda run_dir: write_outputs(run_dir, result, summary, cfg.plot_matrices)],
        report=False,  # its report is rank_summary.json (the method's `report`), which the export writes
    )


def _analyze(
    cfg, run_dir: Path, rows: list[dict], model_name: str, pf: dict, scheme: str, scored_on: str | None
) -> tuple[dict, dict]:
    """The analysis and its summary (for rank_summary.json), written by the caller."""
    model_id, named, vocab = model_shapes(model_name)
    if scored_on and scored_on != model_id:
        raise CorpError(
            f"population in '{run_dir}' was scored on {scored_on} but its config names {model_name} ({model_id})"
        )
    pfilter = ParamFilter(pf.get("include", ".*"), pf.get("exclude", ""))
    named = [(n, s) for n, s in named if pfilter(n)]  # the perturbed parameters (tied weights appear once)
    if not named:
        raise CorpError(
            f"parameter filter (include '{pfilter.include}', exclude "
            f"'{pfilter.exclude}') selects no parameter of {model_id}"
        )
    sigmas = [float(r["sigma"]) for r in rows]
    significance = cfg.significance
    if len(rows) < 16:
        warnings.warn(f"only {len(rows)} specialists: halves of {len(rows) // 2} have very little power")
    result = analyze_population(
        named,
        [int(r["seed"]) for r in rows],
        sigmas,
        [float(r["reward"]) for r in rows],
        ranks=cfg.ranks,
        splits=cfg.splits,
        permutations=cfg.permutations,
        significance=significance,
        seed=cfg.analysis_seed,
        budget_bytes=cfg.memory_mb << 20,
        vocab_size=vocab,
        include_embeddings=cfg.include_embeddings,
        matrices=cfg.matrices,
        threads=cfg.threads or 1,
        scheme=scheme,
    )
    meta_out = {
        "run_dir": str(run_dir),
        "model": model_id,
        "param_filter": pf,
        "sigmas": sorted(set(sigmas)),
        "noise_scheme": scheme,
        "analysis_seed": cfg.analysis_seed,
        "matrices_regex": cfg.matrices,
    }
    summary = summarise(result, meta_out, cfg.ranks, significance)
    if not cfg.skip_power and cfg.power_sims > 0:
        # the same N, sigmas, splits, permutations, grid and level as the analysis just run
        summary["power"] = analysis_power(
            [m["shape"] for m in result["matrices"]],
            sigmas,
            cfg.splits,
            cfg.permutations,
            cfg.ranks,
            significance,
            sims=cfg.power_sims,
            seed=cfg.analysis_seed,
            planted_rank=cfg.power_rank,
            budget_bytes=cfg.memory_mb << 20,
            scheme=scheme,
            threads=cfg.threads or 1,
        )
    return result, summary


def _alias_of(model_id: str) -> str:
    """The corp alias whose model is `model_id` (summaries name the hub id, which may not resolve offline)."""

    for alias, spec in ALIASES.items():
        if getattr(spec, "hf_id", spec) == model_id:
            return alias
    return model_id


def add_power(
    analysis_dir: str | Path, sims: int = 32, planted_rank: int = 1, max_shapes: int = 4, threads: int = 1
) -> dict:
    """Simulate the power of an analysis already written (rank_summary.json) and add it there.

    For analyses made before the power simulation existed, when the population itself is gone:
    N, sigmas, splits, permutations, grid ranks and level come from the summary, the matrix
    shapes from the model's config. Specialist i is given sigmas[i % len(sigmas)], as `corp
    score` assigns them."""
    path = Path(analysis_dir) / "rank_summary.json"
    if not path.exists():
        raise CorpError(f"'{analysis_dir}' has no rank_summary.json; run corp analyze-rank first")
    s = read_json(path)
    need = [k for k in ("model", "n_specialists", "sigmas", "splits", "permutations", "ranks", "r_star") if k not in s]
    if need:
        raise CorpError(f"'{path}' lacks {', '.join(need)}; rerun corp analyze-rank")
    significance = s.get("significance", s.get("alpha"))
    _, named, _ = model_shapes(_alias_of(s["model"]))
    shapes = dict(named)
    missing = [n for n in s["r_star"] if n not in shapes]
    if missing:
        raise CorpError(f"'{path}' names matrices that {s['model']} does not have, e.g. {missing[0]}")
    sigmas = [float(s["sigmas"][i % len(s["sigmas"])]) for i in range(int(s["n_specialists"]))]
    s["power"] = analysis_power(
        [shapes[n] for n in s["r_star"]],
        sigmas,
        int(s["splits"]),
        int(s["permutations"]),
        s["ranks"],
        float(significance),
        sims=sims,
        seed=int(s.get("analysis_seed", 0)),
        planted_rank=planted_rank,
        max_shapes=max_shapes,
        scheme=s.get("noise_scheme", "corp-noise-v1"),
        threads=threads,
    )
    s["power"]["sigmas_assumed"] = (
        "sigmas[i % len(sigmas)] (corp score's assignment), added by add_power after the analysis"
    )
    write_json(path, s)
    return s


if __name__ == "__main__":
    # python -m corp.methods.analyze_rank.split_half DIR [--power-sims N]: add the power block to an existing analysis
    import argparse

    from corp.methods.analyze_rank.power import power_lines, power_sentence

    ap = argparse.ArgumentParser(
        prog="python -m corp.methods.analyze_rank.split_half",
        description="Add the power simulation to an analysis already in DIR (rank_summary.json).",
    )
    ap.add_argument("dir")
    ap.add_argument("--power-sims", type=int, default=32)
    ap.add_argument("--power-rank", type=int, default=1)
    args = ap.parse_args()
    try:
        out = add_power(args.dir, args.power_sims, args.power_rank)
    except CorpError as exc:
        raise SystemExit(f"error: {exc}") from None
    print("\n".join(power_lines(out["power"])))
    print(power_sentence(out["power"]))
