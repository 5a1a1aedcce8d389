"""What `corp METHOD` prints after a run, for methods whose report carries no printed table.

Each function takes the report dict the method returned (and wrote as report.json) and returns
the lines for the terminal. They read keys with .get: a report written by an older corp, or a
method that skipped a stage (e.g. `--skip-test-eval`), prints less rather than failing.
"""

from __future__ import annotations


def _num(value, fmt: str = ".3f") -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "n/a"


def score(report: dict) -> str:
    pop = report.get("population") or {}
    return "\n".join(
        [
            f"{pop.get('n')} specialists; support reward best {_num(pop.get('reward_best'))}, median "
            f"{_num(pop.get('reward_median'))}, worst {_num(pop.get('reward_worst'))}",
            f"run directory: {report.get('run_dir')}",
        ]
    )


def es(report: dict) -> str:
    lines = [
        f"iteration {m['iteration']}: population reward {_num(m.get('reward_mean'))} (max "
        f"{_num(m.get('reward_max'))}), centre {_num(m.get('centre_reward'))}"
        for m in report.get("metrics") or []
    ]
    led = report.get("training_ledger") or {}
    if report.get("table"):
        lines.append(report["table"])
    lines.append(
        f"test accuracy: base {_num(report.get('test_accuracy_before'))} -> es "
        f"{_num(report.get('test_accuracy_after'))}  (training {_num(led.get('flops'), '.3e')} FLOPs)"
    )
    lines.append(f"run directory: {report.get('run_dir')}")
    return "\n".join(lines)


def grpo(report: dict) -> str:
    lines = []
    if report.get("table"):
        lines.append(report["table"])
    elif report.get("test_accuracy_before") is not None:
        lines.append(
            f"test accuracy: base {_num(report['test_accuracy_before'])} -> {report.get('method', 'grpo')} "
            f"{_num(report.get('test_accuracy_after'))}"
        )
    led = report.get("training_ledger") or {}
    if led:
        lines.append(
            f"{report.get('steps')} steps; trained tokens {led.get('trained_tokens')}, inference tokens "
            f"{led.get('prompt_tokens', 0) + led.get('generated_tokens', 0)}, {_num(led.get('flops'), '.3e')} FLOPs"
        )
    lines.append(f"model: {report.get('model_dir')}")
    return "\n".join(lines)


def analyze_rank(report: dict) -> str:
    return "\n".join(
        [
            report.get("text") or report.get("table") or "",
            "wrote rank_analysis.csv, rank_summary.json, "
            f"rank_overlap.png, rank_heatmap.png in {report.get('run_dir')}",
        ]
    )
