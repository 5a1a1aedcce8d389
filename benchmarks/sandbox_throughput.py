"""Throughput of the code sandbox on canonical MBPP solutions, against a plain subprocess.

Modes, measured side by side in one run over the same fixed subset (the first N MBPP problems by
task id, canonical solution + setup + asserts), interleaved round by round so that load from
other users of the machine hits every mode alike:

- plain serial:      `subprocess.run([sys.executable, file])` on code + setup + asserts, one at a time
- sandbox serial:    `run_program(code + setup, tests=asserts)` as the MBPP task runs it (the
                     program serves calls, a separate tester process runs the asserts), one at a time
- plain parallel:    the plain subprocess from a thread pool of the default concurrency
- sandbox parallel:  `run_many` with the default concurrency
- baseline serial:   with `--baseline FILE`, the `run_program` of another version of sandbox.py
                     (e.g. `git show REV:corp/runtime/sandbox/runner.py > /tmp/old_sandbox.py`) on the
                     program concatenated with its asserts, one at a time

Reported: median programs/s over rounds per mode, and the per-program overhead = median sandbox
latency - median plain latency (serial modes), and the median of the per-program paired differences. Writes a markdown table to
results/sandbox-throughput/table.md (and prints it).

Usage: CORP_DATA_DIR=DIR python benchmarks/sandbox_throughput.py [--n 200] [--rounds 3] [--baseline FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from corp.runtime.sandbox import DEFAULT_CONCURRENCY, isolation_level, run_many, run_program, status_counts
from corp.evaluate.tasks.coding import MBPP


def _cpu_seconds() -> float:
    """CPU seconds used so far by this process and its reaped children (the sandbox's wrapper
    reaps init, init reaps the program and the tester, so theirs are included)."""
    import resource

    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def plain_one(path: str) -> tuple[bool, float]:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
    return p.returncode == 0, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="number of MBPP problems (first N by task id)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="results/sandbox-throughput/table.md")
    ap.add_argument(
        "--baseline", help="another version's sandbox.py to compare with (serial, program + asserts in one file)"
    )
    args = ap.parse_args()
    baseline = None
    if args.baseline:
        import importlib.util

        spec = importlib.util.spec_from_file_location("baseline_sandbox", args.baseline)
        baseline = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = baseline  # dataclasses look their module up there
        spec.loader.exec_module(baseline)

    task = MBPP()
    rows = sorted(task._rows(), key=lambda r: r["task_id"])[: args.n]
    examples = [task.make_example(r) for r in rows]
    jobs = [task.job(e.answer, e) for e in examples]
    programs = [f"{code}\n{tests.setup}\n{tests.source}" for code, tests in jobs]  # the plain runs: one file, as before
    tmp = tempfile.mkdtemp(prefix="corp-bench-")
    paths = []
    for i, prog in enumerate(programs):
        path = os.path.join(tmp, f"p{i}.py")
        Path(path).write_text(prog)
        paths.append(path)
    conc = DEFAULT_CONCURRENCY

    modes = ["plain serial", "sandbox serial", "plain parallel", "sandbox parallel"] + (
        ["baseline serial"] if baseline else []
    )
    rates: dict[str, list[float]] = {m: [] for m in modes}
    lat_plain: list[float] = []
    lat_sbx: list[float] = []
    lat_base: list[float] = []
    checks: dict[str, object] = {}
    # CPU seconds per program: less sensitive to the machine's load than wall time
    cpu: dict[str, list[float]] = {m: [] for m in ("plain serial", "sandbox serial", "baseline serial") if m in rates}
    load_before = os.getloadavg()
    for rnd in range(args.rounds):
        order = list(rates) if rnd % 2 == 0 else list(reversed(rates))
        for mode in order:
            t = time.perf_counter()
            c0 = _cpu_seconds()
            if mode == "plain serial":
                out = [plain_one(p) for p in paths]
                lat_plain += [s for _, s in out]
                checks[mode] = sum(ok for ok, _ in out)
            elif mode == "sandbox serial":
                res = [run_program(code, tests=tests, timeout=10) for code, tests in jobs]
                lat_sbx += [r.wall_s for r in res]
                checks[mode] = status_counts(res)["pass"]
            elif mode == "baseline serial":
                res = [baseline.run_program(p, timeout=10) for p in programs]
                lat_base += [r.wall_s for r in res]
                checks[mode] = sum(r.status.value == "pass" for r in res)
            elif mode == "plain parallel":
                with ThreadPoolExecutor(conc) as pool:
                    out = list(pool.map(plain_one, paths))
                checks[mode] = sum(ok for ok, _ in out)
            else:
                res = run_many(jobs, concurrency=conc, timeout=10)
                checks[mode] = status_counts(res)["pass"]
            rates[mode].append(len(programs) / (time.perf_counter() - t))
            if mode in cpu:
                cpu[mode].append((_cpu_seconds() - c0) / len(programs))
    load_after = os.getloadavg()
    for p in paths:
        os.remove(p)
    os.rmdir(tmp)

    med_plain, med_sbx = statistics.median(lat_plain), statistics.median(lat_sbx)
    lines = [
        f"# Sandbox throughput: {len(programs)} canonical MBPP solutions (task ids "
        f"{rows[0]['task_id']}-{rows[-1]['task_id']}), {args.rounds} rounds",
        "",
        f"Machine: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), Python "
        f"{platform.python_version()}, load average {load_before[0]:.2f} before / {load_after[0]:.2f} after (shared "
        f"machine). Default concurrency = {conc}. Sandbox isolation level: {isolation_level()['level']}.",
        "",
        "| mode | concurrency | programs/s (median) | min - max over rounds | passed |",
        "| --- | ---: | ---: | --- | ---: |",
    ]
    for mode, vals in rates.items():
        c = 1 if "serial" in mode else conc
        lines.append(
            f"| {mode} | {c} | {statistics.median(vals):.1f} | {min(vals):.1f} "
            f"- {max(vals):.1f} | {checks[mode]}/{len(programs)} |"
        )
    lines += [
        "",
        "| per-program latency (serial) | median ms | p90 ms |",
        "| --- | ---: | ---: |",
        f"| plain `subprocess.run([python, file])` | {med_plain * 1e3:.1f} | "
        f"{statistics.quantiles(lat_plain, n=10)[-1] * 1e3:.1f} |",
        f"| sandbox `run_program` | {med_sbx * 1e3:.1f} | {statistics.quantiles(lat_sbx, n=10)[-1] * 1e3:.1f} |",
        f"| **overhead per program** (difference of medians) | **{(med_sbx - med_plain) * 1e3:.1f}** | |",
        "| overhead per program (median of paired differences, same program and round) | "
        f"{statistics.median(a - b for a, b in zip(lat_sbx, lat_plain)) * 1e3:.1f} | |",
        "",
        "| CPU time per program (serial; caller + all its child processes, median over rounds) | ms |",
        "| --- | ---: |",
        f"| plain | {statistics.median(cpu['plain serial']) * 1e3:.1f} |",
        f"| sandbox | {statistics.median(cpu['sandbox serial']) * 1e3:.1f} |",
    ]
    if baseline:
        lines += [
            f"| baseline ({args.baseline}) | {statistics.median(cpu['baseline serial']) * 1e3:.1f} |",
            "",
            f"Baseline `run_program` latency (serial): median {statistics.median(lat_base) * 1e3:.1f} ms; this "
            "sandbox minus the baseline, median of paired differences (same program and round): "
            f"{statistics.median(a - b for a, b in zip(lat_sbx, lat_base)) * 1e3:.1f} ms.",
        ]
    lines += [
        "",
        "Plain runs use the venv interpreter with its site-packages; the sandbox runs `python -I "
        "-S` (site-packages put on the path without `site`) plus three forks (init, program, "
        "tester), namespaces (net, pid, mount, ipc; user when not root), a private root (tmpfs, "
        "read-only binds of the system directories and the interpreter prefixes, /dev, /tmp, a "
        "fresh /proc, pivot_root) per program, and every assert's call crosses a pipe as plain data.",
    ]
    table = "\n".join(lines) + "\n"
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
