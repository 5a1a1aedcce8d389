"""Off-task retention of the bench's final models (issue 39), under `retention: true`.

After the cells run, every final cell at the top budget in the headline setting (and every fixed
cell there, which holds the base) is scored off its task, one row at a time: a row that is one model
(a saved RUN_DIR/model, the base itself, or RandOpt's top-1 rebuilt from its seed and sigma) gets bits per byte on the held-out public-domain text and
greedy accuracy on the off-task tasks' bench test examples, beside the base, by `corp eval
--retention`'s own code (corp.evaluate.retention.score_retention, in an eval run directory of its
own under WORK_DIR/NAME/retention/). A row that is not one model says why: a vote or a sampling
ensemble, RandOpt's rows on CoRP's population, a method that saves no model, or an iterative run trained past the cell's budget (its saved model is
a later checkpoint than the cell's). The record goes to RESULTS_DIR/NAME/retention/<the cell's
record name>: a rerun, or `--report-only`, reads it instead of scoring again. Its FLOPs (the
ledger's formula: 2 N per scored or generated token, for the model and the base) are reported and
never charged to the method's budget: like test, this is evaluation.
"""

from __future__ import annotations

import statistics
import warnings
from pathlib import Path

from corp.algorithms.perturb.direction import Direction, ParamFilter, Perturber
from corp.algorithms.stats import compare_paired_seeds, seed_example_interval
from corp.bench.config import (
    at_budget,
    budget_text,
    common_options,
    file_part,
    file_slug,
    headline_setting,
    results_path,
    save_plot,
    units_in,
)
from corp.config import load_config
from corp.errors import CorpError
from corp.evaluate.passk import NAME as EVAL
from corp.evaluate.passk import EvalConfig
from corp.evaluate.retention import DEFAULT_TEXT, score_retention, titles
from corp.evaluate.tasks import SplitSizes
from corp.method import ITERATIVE
from corp.methods import get_method
from corp.methods.self_consistency import NAME as SELF_CONSISTENCY
from corp.runtime.context import open_run, run_evals
from corp.runtime.ledger import flops
from corp.runtime.models import load_model, save_model
from corp.runtime.runs import read_json, try_flock, write_json

RETENTION_DIR = "retention"
RECORD_FORMAT = 1
REBUILD = "<rebuild randopt-top1>"  # `target`'s marker: the model is built from the cell's top-1 (seed, sigma)
# `target`'s marker: the model exists, but not on this machine (a later session's fresh checkout)
ELSEWHERE = "<run directory not here>"


def off_tasks(cfg, task: str) -> list[str]:
    """The tasks that count as off-task for `task`: `retention_tasks`, else the bench's other tasks."""
    return [t for t in (cfg.retention_tasks or cfg.tasks) if t != task]


def in_scope(cfg, rec: dict) -> bool:
    """Whether a final record is scored: done, in the headline setting, at the top budget (or fixed)."""

    return (
        rec.get("status") == "done"
        and rec["setting"] == headline_setting(cfg)
        and rec.get("budget") in (None, max(cfg.budgets))
    )


def target(cfg, rec: dict, row: dict) -> tuple[str | None, str]:
    """(the model to score, what it is) for one row of a record; (None, why not) when it is not one model."""

    name = row["name"]
    if name == "base":
        return cfg.model, "the base itself"
    if (row.get("passes_per_example") or 1) != 1:
        return None, f"not one model ({row['passes_per_example']} passes per example: a vote or sampling ensemble)"
    if row.get("population_row"):
        return None, "RandOpt's row on CoRP's population: a specialist of that population, not rebuilt here"
    method = get_method(rec["method"])
    if rec["method"] == SELF_CONSISTENCY:
        return None, "sampling from the base model (its weights are the base's: see the base row)"
    if not method.model:
        if name == "randopt-top1" and rec.get("population_run"):
            needs = [Path(rec["run_dir"]) / "report.json", Path(rec["population_run"]) / "population_meta.json"]
            gone = [str(p) for p in needs if not p.exists()]
            if gone:
                return ELSEWHERE, f"its seed and sigma are in {' and '.join(gone)}, not on this machine"
            return REBUILD, "its top-1 specialist, rebuilt from its seed and sigma"
        return None, "the method saves no model"
    return _saved_model(rec, method.bench)


def _saved_model(rec: dict, adapter) -> tuple[str | None, str]:
    """`target` for a method that saves a model: the cell's run directory's, unless it is gone or is a later
    checkpoint than the cell's (an iterative run trained past the cell's budget)."""
    run_dir = Path(rec.get("run_dir") or "")
    if not run_dir.is_dir():
        return ELSEWHERE, f"its run directory '{run_dir}' is not on this machine"
    if not (run_dir / "model").is_dir():
        return None, f"no saved model in '{run_dir}'"
    if adapter is not None and adapter.kind == ITERATIVE and adapter.units_done:
        report = read_json(run_dir / "report.json") if (run_dir / "report.json").exists() else {}

        try:
            saved = units_in(report, adapter.units_done)
        except Exception:  # noqa: BLE001 - no report: the saved model cannot be tied to the cell
            saved = None
        if saved != rec.get("units"):
            return None, (
                f"its run was trained past this budget ({saved} {adapter.unit}, the cell's model is at "
                f"{rec.get('units')}); the cell's checkpoint is not kept"
            )
    return str(run_dir / "model"), "the cell's saved model"


def rebuild_top1(cfg, rec: dict, out: Path) -> str:
    """RandOpt's top-1 specialist as a model directory: the base plus sigma * eps(seed) under the
    shared population's noise scheme and parameter filter (its population_meta.json), the same
    arithmetic the scorer evaluated; (seed, sigma) from the cell's report row. Built once."""

    if (out / "config.json").exists():
        return str(out)
    report = read_json(Path(rec["run_dir"]) / "report.json")
    row = next(r for r in report["rows"] if r["method"] == "randopt-top1")
    meta = read_json(Path(rec["population_run"]) / "population_meta.json")
    model, tokenizer, _, _ = load_model(cfg.model, "cpu", cfg.dtype)
    perturber = Perturber(model, ParamFilter(**meta["param_filter"]), scheme=meta["noise_scheme"])
    perturber.apply(Direction.single(row["seed"], row["sigma"]))
    save_model(model, tokenizer, out)
    return str(out)


def score_model(cfg, task: str, seed: int, model: str, run_dir: Path) -> dict:
    """`corp eval --retention`'s scoring of `model` beside the bench's base, off `task`: its report
    (corp.evaluate.retention) plus the FLOPs it took."""

    off = off_tasks(cfg, task)
    sizes = {"n_support": cfg.n_support, "n_probe": cfg.n_probe, "n_validation": cfg.n_validation, "n_test": cfg.n_test}
    opts = {
        **common_options(cfg, task, seed),
        **sizes,
        "model": model,
        "retention": True,
        "base": cfg.model,
        "run_dir": str(run_dir),
        # one cache for every retention run of the bench: the base's off-task evaluations run once
        "eval_cache": str(Path(cfg.work_dir) / cfg.name / "retention__shared_evals.jsonl"),
    }
    if off:
        opts["retention_tasks"] = ";".join(off)
    opts["retention_texts"] = ",".join(cfg.retention_texts)
    ecfg = load_config(EvalConfig, None, opts)
    with open_run(ecfg, EVAL, None, needs=("test",), host_copy=None) as ctx:  # it only scores
        n_params = int(ctx.backend.n_params)
        report = score_retention(
            ctx,
            run_evals(ctx),
            ";".join(off),
            cfg.model,
            own_task=False,
            sizes=SplitSizes(*sizes.values()),
            texts=ecfg.retention_texts,
        )
    spent = 0.0
    for m in report["models"].values():
        spent += flops(n_params, m["bpb"]["tokens"] + m["bpb"]["windows"])  # one start token per window
        spent += sum(flops(n_params, t["prompt_tokens"], t["generated_tokens"]) for t in m["tasks"].values())
    return {"report": report, "flops": spent}


def compact(scored: dict) -> dict:
    """What the bench keeps of a retention report: per-window bits (for intervals across seeds), per-task outcomes."""
    rep = scored["report"]
    mine, base = rep["models"]["model"], rep["models"]["base"]
    keep = ("bpb", "interval", "windows", "tokens", "bytes", "window_bits", "window_bytes")
    return {
        "status": "scored",
        "bpb": {k: mine["bpb"][k] for k in keep},
        "bpb_base": {k: base["bpb"][k] for k in keep},
        "bpb_change": rep["change"]["bpb"],
        "tasks": {
            spec: {
                "accuracy": t["accuracy"],
                "base_accuracy": base["tasks"][spec]["accuracy"],
                "n": t["n"],
                "correct": t["correct"],
                "base_correct": base["tasks"][spec]["correct"],
                "change": rep["change"]["tasks"][spec]["difference"],
                "ci95": rep["change"]["tasks"][spec]["ci95"],
            }
            for spec, t in mine["tasks"].items()
        },
        "flops": scored["flops"],
        "text": {
            **{k: rep["text"][k] for k in ("title", "license", "source", "bytes", "sha256")},
            "name": rep["text"].get("name", DEFAULT_TEXT),
        },
        **({"bpb_by_text": rep["change"]["bpb_by_text"]} if "bpb_by_text" in rep["change"] else {}),
    }


def record_texts(ret: dict) -> list[str]:
    """The texts a retention record's rows were scored on (a record from before `retention_texts`: the default)."""
    scored = [r for r in ret["rows"].values() if r.get("status") == "scored"]
    return scored[0]["text"].get("name", DEFAULT_TEXT).split(",") if scored else []


def check_texts(cfg, ret: dict, path: Path) -> None:
    """A retention record scored on texts other than the config's is refused: its bits per byte would not
    compare with the others' (and records are never redone)."""
    have = record_texts(ret)
    if have and have != list(cfg.retention_texts):
        raise CorpError(
            f"retention record '{path}' was scored on {','.join(have)}, the config says retention_texts "
            f"{','.join(cfg.retention_texts)}: restore the config's texts, or move RESULTS_DIR/NAME/retention "
            "aside to score every final cell again"
        )


def retention_file(cfg, record_name: str) -> Path:

    return results_path(cfg) / RETENTION_DIR / record_name


def score_records(cfg, done: dict[str, dict], scorer=None) -> int:
    """Score every in-scope final record of `done` ({record name: record}) that has no retention record
    yet (another process scoring one is skipped: it writes it); returns how many were scored."""

    scorer = scorer or score_model
    work = Path(cfg.work_dir) / cfg.name / RETENTION_DIR
    made = 0
    for name, rec in done.items():
        path = retention_file(cfg, name)
        if path.exists():
            check_texts(cfg, read_json(path), path)
            continue
        if rec.get("setting") == "tune" or not in_scope(cfg, rec):
            continue
        claim = work / "claims" / f"{name}.lock"
        claim.parent.mkdir(parents=True, exist_ok=True)
        with open(claim, "a+") as fh:
            if not try_flock(fh) or path.exists():
                continue
            targets = {row["name"]: target(cfg, rec, row) for row in rec["rows"]}
            away = [what for model, what in targets.values() if model == ELSEWHERE]
            if away:
                # no record: an "n/a" written now would stand for good, though the checkout that ran the cell
                # can still score it; the report counts the cell as not scored yet
                warnings.warn(
                    f"retention of {name} not scored: {away[0]}; run the bench again from the checkout whose "
                    f"work directory ({cfg.work_dir}) holds it",
                    stacklevel=2,
                )
                continue
            rows = {}
            for row in rec["rows"]:
                model, what = targets[row["name"]]
                if model is None:
                    rows[row["name"]] = {"status": "n/a", "reason": what}
                    continue
                run_dir = work / f"{Path(name).stem}__{file_slug(row['name'])}"
                if model == REBUILD:
                    model = rebuild_top1(cfg, rec, work / "models" / f"{Path(name).stem}__{file_slug(row['name'])}")
                rows[row["name"]] = {**compact(scorer(cfg, rec["task"], rec["seed"], model, run_dir)), "model": what}
            head = {k: rec.get(k) for k in ("task", "setting", "seed", "method", "label", "budget")}
            write_json(path, {"format": RECORD_FORMAT, "cell": name, **head, "rows": rows})
            made += 1
    return made


def load_records(cfg, records: list[dict]) -> list[dict]:
    """The retention records of the reported final records (matched by task, setting, seed, label, budget)."""

    where = results_path(cfg) / RETENTION_DIR
    if not where.is_dir():
        return []
    keys = {_cell(r) for r in records}
    out = []
    for path in sorted(where.glob("*.json")):
        ret = read_json(path)
        if _cell(ret) in keys:
            check_texts(cfg, ret, path)
            out.append(ret)
    return out


def unscored(cfg, records: list[dict], rets: list[dict]) -> int:
    """How many in-scope final records have no retention record (not scored yet: their run ended before
    scoring, and their run directories are not on this machine)."""

    have = {_cell(r) for r in rets}
    return sum(1 for r in records if in_scope(cfg, r) and _cell(r) not in have)  # in_scope: never a trial


def _cell(rec: dict) -> tuple:
    """What ties a retention record to its cell record."""
    return rec["task"], rec["setting"], rec["seed"], rec["label"], rec.get("budget")


# ----------------------------------------------------------------------------- statistics per method


def summarise(cfg, rows: list[dict], rets: list[dict]) -> list[dict]:
    """Per task and row name (in the headline setting, top budget): the on-task gain over the base,
    the bits-per-byte change and each off-task accuracy change, means over seeds with 95% intervals
    (across seeds when >= 2: `seed_example_interval` over windows / examples; one seed: its paired
    bootstrap), or the reason the row has none."""

    setting, top = headline_setting(cfg), max(cfg.budgets)
    out = []
    for task in cfg.tasks:
        by = at_budget(rows, task, setting, top)
        per: dict[str, dict[int, dict]] = {}
        for ret in rets:
            if ret["task"] == task and ret["setting"] == setting:
                for name, r in ret["rows"].items():
                    per.setdefault(name, {})[ret["seed"]] = r
        for name, seeds in per.items():
            entry = {"task": task, "name": name, "seeds": sorted(seeds)}
            scored = {s: r for s, r in seeds.items() if r["status"] == "scored"}
            if not scored:
                entry["na"] = next(iter(seeds.values()))["reason"]
                out.append(entry)
                continue
            ks = sorted(scored)
            entry["flops"] = statistics.fmean(r["flops"] for r in scored.values())
            mine = {r["seed"]: r for r in by.get(name, []) if r["correct"] is not None}
            base = {r["seed"]: r for r in by.get("base", []) if r["correct"] is not None}
            both = [s for s in ks if s in mine and s in base]
            if both:
                c = compare_paired_seeds(
                    name, [mine[s]["correct"] for s in both], "base", [base[s]["correct"] for s in both]
                )
                entry["gain"] = {"mean": c["difference"], "ci": list(c["ci95"]), "seeds": len(both)}
            mean_bytes = statistics.fmean(scored[ks[0]]["bpb"]["window_bytes"])
            if len(ks) > 1:
                iv = seed_example_interval(
                    [[b / mean_bytes for b in scored[s]["bpb"]["window_bits"]] for s in ks],
                    [[b / mean_bytes for b in scored[s]["bpb_base"]["window_bits"]] for s in ks],
                )
                entry["bpb"] = {"mean": iv["mean"], "ci": list(iv["ci"]), "seeds": len(ks)}
            else:
                d = scored[ks[0]]["bpb_change"]
                entry["bpb"] = {"mean": d["delta"], "ci": list(d["interval"]), "seeds": 1}
            entry["base_bpb"] = scored[ks[0]]["bpb_base"]["bpb"]
            entry["tasks"] = {}
            for spec in scored[ks[0]]["tasks"]:
                c = compare_paired_seeds(
                    name,
                    [scored[s]["tasks"][spec]["correct"] for s in ks],
                    "base",
                    [scored[s]["tasks"][spec]["base_correct"] for s in ks],
                )
                entry["tasks"][spec] = {"mean": c["difference"], "ci": list(c["ci95"]), "seeds": len(ks)}
            out.append(entry)
    return out


def _iv(x: dict | None, digits: int = 3) -> str:
    if not x:
        return "—"
    lo, hi = x["ci"]
    seeds = "" if x.get("seeds", 1) > 1 else " (1 seed)"
    return f"{x['mean']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]{seeds}"


def section(cfg, summary: list[dict], missing: int = 0) -> list[str]:
    """table.md's "Off-task retention" section; `missing`: in-scope final cells not scored yet (`unscored`)."""

    others = list(dict.fromkeys(spec for e in summary for spec in e.get("tasks", {})))
    lines = [
        f"## Off-task retention ({headline_setting(cfg)}, budget {budget_text(max(cfg.budgets))} FLOPs)",
        "",
        f"Each method's final model scored off its task, as `corp eval --retention` scores a saved model: bits per "
        f"byte on {titles(cfg.retention_texts, licenses=True)}, lower is better, and greedy accuracy on the other tasks' bench "
        "test examples; each as the change from the base on the same windows and examples, mean over seeds with "
        "its 95% interval (>= 2 seeds: a t interval over seeds plus the windows' or examples' term; 1 seed: a "
        "paired bootstrap). On-task gain: test accuracy minus the base's, paired the same way. Retention FLOPs "
        "(the model's and the base's scoring) are evaluation, like test: not charged to the method's budget.",
        "",
        "| task | method | on-task gain | bits/byte change | "
        + "".join(f"{cfg.label(t)} accuracy change | " for t in others)
        + "retention FLOPs |",
        "|---|---|---|---|" + "---|" * len(others) + "---:|",
    ]
    for e in summary:
        where = f"| {cfg.label(e['task'])} | {e['name']} |"
        if "na" in e:
            lines.append(f"{where} n/a — {e['na']} |" + " |" * (len(others) + 2))
            continue
        accs = "".join(f" {_iv(e['tasks'].get(t))} |" for t in others)
        lines.append(f"{where} {_iv(e.get('gain'))} | {_iv(e['bpb'], 4)} |{accs} {e['flops']:.2g} |")
    if missing:
        lines += [
            "",
            f"Not scored yet: {missing} final cell(s) in scope have no retention record (their models are in "
            f"run directories under {cfg.work_dir} on the machine that ran them; a bench run there scores them).",
        ]
    return lines + [""]


def readme_lines(cfg, summary: list[dict]) -> list[str]:
    """The README's paragraph on what each single model costs off its task, from bench.json's `retention`
    (the section's rows with numbers, the base left out: it changes by 0), each bits-per-byte change's bound (its
    interval's upper end) and which intervals lie above 0 (worse than the base); [] where nothing was scored.
    Pooled over seeds, an interval that includes 0 does not say no seed's model got worse (issue 55)."""

    got = [e for e in summary if "na" not in e and e["name"] != "base" and e.get("bpb")]
    if not got:
        return []
    parts = []
    for e in got:
        others = "".join(f", {cfg.label(t)} accuracy {_iv(x)}" for t, x in e.get("tasks", {}).items())
        parts.append(f"{e['name']} on {cfg.label(e['task'])}: bits/byte {_iv(e['bpb'], 4)}{others}")
    several = len({e["task"] for e in got}) > 1
    named = [(e["name"] + (f" on {cfg.label(e['task'])}" if several else ""), e["bpb"]["ci"]) for e in got]
    bounds = ", ".join(f"{n} {hi:+.4f}" for n, (_, hi) in named)
    worse = [n for n, (lo, _) in named if lo > 0]
    verdict = (
        "Bounds on the bits-per-byte cost (with 97.5% confidence each method's mean change over seeds is below "
        f"the upper end of its 95% interval): {bounds}"
        + (f"; worse than the base (the interval above 0): {', '.join(worse)}" if worse else "")
        + ". These bound the mean over seeds: one seed's model can still be worse than the base (each seed's "
        "change and interval are in its retention record)."
    )
    return [
        f"Off its task (top budget, {headline_setting(cfg)}; change from the base, mean over seeds with its 95% "
        f"interval; bits per byte on {titles(cfg.retention_texts)}, lower is better, and greedy accuracy on the other tasks' test "
        "examples): " + "; ".join(parts) + ". " + verdict
    ]


def plot(cfg, summary: list[dict], out: Path) -> list[str]:
    """One plot per task: on-task gain against the bits-per-byte change, per method, with 95% error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    for task in cfg.tasks:
        pts = [e for e in summary if e["task"] == task and "na" not in e and e.get("gain")]
        if not pts:
            continue
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        for e in pts:
            x, y = e["bpb"], e["gain"]
            ax.errorbar(
                [x["mean"]],
                [y["mean"]],
                xerr=[[x["mean"] - x["ci"][0]], [x["ci"][1] - x["mean"]]],
                yerr=[[y["mean"] - y["ci"][0]], [y["ci"][1] - y["mean"]]],
                marker="o",
                capsize=3,
                ls="none",
                label=e["name"],
            )
        ax.axhline(0, color="grey", lw=0.8)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_xlabel("off-task: bits per byte change from base (held-out text; > 0 is worse)")
        ax.set_ylabel("on-task: test accuracy gain over base")
        ax.set_title(f"{cfg.name}: {cfg.label(task)}, {headline_setting(cfg)}, top budget (95% intervals)")
        ax.legend(fontsize=7, loc="best")
        made.append(save_plot(fig, out, f"retention__{file_part(cfg.label(task))}__{headline_setting(cfg)}.png"))
    return made
