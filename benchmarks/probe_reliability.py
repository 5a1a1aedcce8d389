"""Probe issue 41's reliability cases through the real `corp` CLI on a tiny random Llama built here
(seconds per case, no network, no embedded model); prints one PASS/FAIL line per case, the counts
per command, and exits 1 when any case fails.

A case is a hostile or new-user input to one command. Its right outcome is either one `error` line
on stderr, exit code 2 and no traceback (where the input names an option, a value or a path, the
line must name it too), or a correct success. Input-validation cases run in this process through
click's test runner on the real `corp.cli:app` (the same `_OneLineErrors` entry and `_run` wrapper
as the `corp` script; importing corp costs seconds per process, so 150 processes would take 20+
minutes on 2 cores); an exception that escapes the CLI there is reported with its traceback, as
the script would print it, and a case that runs past its limit is a hang. Cases about processes
(faults planted in a library, Ctrl-C, a kill -9 and resume, a user who cannot write) run
`python -m corp.cli` in a fresh process each.

Faults the CLI cannot be asked for (a full disk inside the tokenizers library, Ctrl-C at a given
moment) are planted by a `sitecustomize.py` on PYTHONPATH that a case switches on with
CORP_PROBE_FAULT; nothing in corp is changed.

    python benchmarks/probe_reliability.py [--keep DIR] [--only SUBSTRING] [--no-subprocess]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = {"CORP_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
CASE_LIMIT_S = 180  # an in-process case still running after this is a hang

SITECUSTOMIZE = """
import os
fault = os.environ.get("CORP_PROBE_FAULT")
if fault == "tokenizer-full":
    from transformers import PreTrainedTokenizerFast

    def _full(*a, **k):
        raise Exception("No space left on device (os error 28)")  # what the tokenizers library raises

    PreTrainedTokenizerFast.save_pretrained = _full
elif fault == "ctrl-c":
    import corp.algorithms.recipe as _r
    import corp.methods as _m

    def _interrupt(*a, **k):
        raise KeyboardInterrupt

    _r.apply_recipe = _interrupt
    _m.Method.__call__ = _interrupt
elif fault == "ctrl-c-analysis":  # Ctrl-C once analyze-rank's population is scored, in the analysis itself
    import corp.methods.analyze_rank.split_half as _sh

    def _interrupt(*a, **k):
        raise KeyboardInterrupt

    _sh.analyze_population = _interrupt
elif fault == "card-full":  # the disk fills while a model card is written (the file is made, then no space)
    import errno
    import pathlib

    _write_text = pathlib.Path.write_text

    def _card_full(self, text, *a, **k):
        if self.name.startswith(("README.md", ".README.md")):
            _write_text(self, "")
            raise OSError(errno.ENOSPC, "No space left on device")
        return _write_text(self, text, *a, **k)

    pathlib.Path.write_text = _card_full
"""

# per method: the options that keep a run that does start to a few seconds on the tiny model
TINY = {
    "score": ["--population", "2", "--sigmas", "0.05"],
    "randopt": ["--population", "2", "--sigmas", "0.05", "--top-k", "1"],
    "consolidate": ["--population", "2", "--sigmas", "0.05", "--top-k", "1", "--alphas", "1", "--n-probe", "2"]
    + ["--n-validation", "2"],  # it needs a probe and a validation split
    "es": ["--iterations", "1", "--population-per-iteration", "2", "--sigma", "0.05"],
    "grpo": ["--max-steps", "1", "--prompts-per-step", "1", "--num-generations", "2", "--save-steps", "1"]
    + ["--skip-test-eval"],
    "eval": [],
    "self-consistency": ["--vote-k", "1,2"],
    "fedcorp": ["--population", "2", "--sigmas", "0.05", "--clients", "2", "--split-by", "iid", "--alphas", "1"]
    + ["--n-probe", "2", "--n-validation", "2"],
    "fgrpo": ["--rounds", "1", "--clients", "2", "--split-by", "iid", "--local-steps", "1", "--prompts-per-step", "1"]
    + ["--num-generations", "2", "--skip-test-eval"],
    "analyze-rank": ["--population", "4", "--sigmas", "0.05", "--splits", "1", "--permutations", "19"]
    + ["--skip-power", "--ranks", "1"],
    "ftis": ["--max-steps", "1", "--prompts-per-step", "1", "--num-generations", "2", "--skip-test-eval"]
    + ["--skip-grpo-baseline"],
    "fera": ["--clients", "2", "--rounds", "1", "--num-generations", "2", "--shots", "1"],
}
METHODS = list(TINY)

Res = collections.namedtuple("Res", "returncode stdout stderr")


class CaseTimeout(BaseException):
    """Raised by SIGALRM in an in-process case (a BaseException: click's runner catches only Exception)."""


def tiny_model(path: Path) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import make_char_tokenizer, make_tiny_llama  # the tests' tiny model, one definition

    tok = make_char_tokenizer()
    model = make_tiny_llama(tok)
    model.save_pretrained(path)
    tok.save_pretrained(path)


class Probe:
    def __init__(self, root: Path, only: str | None = None, listing: bool = False):
        self.root, self.only, self.listing = root, only, listing
        self.results: list[tuple[str, str, bool, str]] = []  # (command, case, passed, detail)
        self.listed: list[tuple[str, str]] = []
        self.n = 0
        self._cli = None
        (root / "site").mkdir()
        (root / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self.model = root / "tiny"
        if not listing:
            tiny_model(self.model)

    # ------------------------------------------------------------ running corp

    def corp(
        self, *args, fault: str | None = None, cwd: Path | None = None, user: int | None = None
    ) -> subprocess.CompletedProcess:
        """`python -m corp.cli ARGS` in a fresh process (as uid `user` when given)."""
        env = {**os.environ, **ENV}
        env["PYTHONPATH"] = os.pathsep.join([str(self.root / "site"), str(REPO)])
        env.pop("CORP_PROBE_FAULT", None)
        if fault:
            env["CORP_PROBE_FAULT"] = fault
        prefix = []
        if user is not None:
            prefix = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"]
            env["HOME"] = str(self.root / "home")
        return subprocess.run(
            [*prefix, sys.executable, "-m", "corp.cli", *map(str, args)],
            capture_output=True,
            text=True,
            cwd=cwd or self.root,
            env=env,
            timeout=600,
        )

    def inproc(self, *args, limit: int = CASE_LIMIT_S) -> Res:
        """`corp ARGS` in this process: the real click app, its one-line error handling included."""
        from click.testing import CliRunner

        if self._cli is None:
            import typer.main

            from corp.cli import app

            self._cli = typer.main.get_command(app)

        def alarm(signum, frame):
            raise CaseTimeout

        old = signal.signal(signal.SIGALRM, alarm)
        here = os.getcwd()
        os.chdir(self.root)
        signal.alarm(limit)
        try:
            r = CliRunner().invoke(self._cli, [str(a) for a in args], prog_name="corp", catch_exceptions=True)
        except CaseTimeout:
            return Res(124, "", f"hang: still running after {limit} s")
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
            os.chdir(here)
        stderr = r.stderr
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            stderr += "Traceback (escaped the CLI):\n" + "".join(traceback.format_exception(*r.exc_info))
        return Res(r.exit_code, r.stdout, stderr)

    # ------------------------------------------------------------ checking

    def check(self, command: str, name: str, ok: bool, detail: str = "") -> None:
        self.results.append((command, name, ok, detail))
        print(
            f"{'PASS' if ok else 'FAIL'}  [{command}] {name}" + ("" if ok else f"\n      {detail[-900:]}"), flush=True
        )

    def one_line(self, res, *fragments: str) -> tuple[bool, str]:
        errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error")]
        ok = res.returncode == 2 and len(errors) == 1 and "Traceback" not in res.stderr
        ok = ok and all(f in errors[0] for f in fragments)
        return ok, f"exit {res.returncode}; stderr: {res.stderr}"

    def run_dir(self) -> Path:
        self.n += 1
        return self.root / "runs" / f"r{self.n:03d}"

    def small(self, run_dir: Path) -> list[str]:
        return [
            "--model",
            self.model,
            "--task",
            "arith",
            "--n-support",
            "2",
            "--n-probe",
            "0",
            "--n-validation",
            "0",
        ] + ["--n-test", "2", "--max-completion-length", "2", "--output-dir", run_dir]

    def tiny(self, command: str, *extra) -> list:
        """A tiny run of a method command, then `extra` (later flags win)."""
        return [command, *self.small(self.run_dir()), *TINY[command], *extra]

    def case(
        self, command: str, name: str, argv: list, expect: str = "error", *fragments: str, extra=None
    ) -> Res | None:
        """Run `corp ARGV` in this process and check it. expect: error (one line naming every fragment),
        ok (exit 0), clean (exit 0 or one error line; never a traceback)."""
        if self.only and not any(part in f"{command} {name}" for part in self.only.split("|")):
            return None
        if self.listing:
            self.listed.append((command, name))
            print(f"[{command}] {name}")
            return None
        res = self.inproc(*argv)
        shown = "$ corp " + " ".join(map(str, argv))
        if expect == "error":
            ok, why = self.one_line(res, *fragments)
        elif expect == "ok":
            ok = res.returncode == 0 and "Traceback" not in res.stderr
            why = f"exit {res.returncode}; stderr: {res.stderr}"
        else:
            ok = (res.returncode == 0 or self.one_line(res)[0]) and "Traceback" not in res.stderr
            why = f"exit {res.returncode}; stderr: {res.stderr}"
        if ok and extra is not None:
            ok, why = extra(res), f"{why}; stdout: {res.stdout[-400:]}"
        self.check(command, name, ok, f"{shown}\n      {why}")
        return res


def es_args(p: Probe, run: Path, *extra) -> list:
    return ["es", *p.small(run), "--iterations", "1", "--population-per-iteration", "2", "--sigma", "0.05", *extra]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", help="work in this directory and keep it (default: a temporary one, removed)")
    ap.add_argument(
        "--only", help="run only the in-process cases whose 'command name' contains one of these, '|'-separated"
    )
    ap.add_argument("--no-subprocess", action="store_true", help="skip the cases that start processes")
    ap.add_argument("--list", action="store_true", help="list the in-process cases and run nothing")
    args = ap.parse_args()
    os.environ.update(ENV)
    started = time.monotonic()
    print(f"machine: {os.cpu_count()} CPU cores, Python {sys.version.split()[0]}", flush=True)
    root = Path(args.keep or tempfile.mkdtemp(prefix="corp-probe-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    p = Probe(root, args.only, listing=args.list)
    try:
        if args.list:  # name the in-process cases; run nothing
            (root / "es-run").mkdir()
            (root / "es-run" / "recipe.json").write_text("{}")
            in_process_cases(p, root / "es-run" / "recipe.json", root / "score-run")
            issue57_cases(p)
            print(
                f"\n{len(p.listed)} in-process cases, per command: {dict(collections.Counter(c for c, _ in p.listed))}"
            )
            return 0
        recipe, score_run = setup(p)
        in_process_cases(p, recipe, score_run)
        issue57_cases(p)
        if not args.no_subprocess and not args.only:
            subprocess_cases(p, recipe)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    report(p, time.monotonic() - started)
    return 1 if any(not ok for _, _, ok, _ in p.results) else 0


def report(p: Probe, seconds: float) -> None:
    per = collections.OrderedDict()
    for command, _, ok, _ in p.results:
        per.setdefault(command, [0, 0])[0 if ok else 1] += 1
    print("\ncommand            passed  failed")
    for command, (good, bad) in per.items():
        print(f"{command:<18} {good:>6}  {bad:>6}")
    failed = [r for r in p.results if not r[2]]
    for command, name, _, detail in failed:
        print(f"\nFAILED [{command}] {name}\n      {detail[-1500:]}")
    print(f"\n{len(p.results) - len(failed)} passed, {len(failed)} failed in {seconds:.0f} s")


def setup(p: Probe) -> tuple[Path, Path]:
    """A finished ES run (its recipe for apply) and a scored population (for --from-run), in process."""
    es_run = p.root / "es-run"
    res = p.inproc(*es_args(p, es_run))
    assert res.returncode == 0, res.stderr[-3000:]
    score_run = p.root / "score-run"
    res = p.inproc("score", *p.small(score_run), *TINY["score"])
    assert res.returncode == 0, res.stderr[-3000:]
    return es_run / "recipe.json", score_run


# ---------------------------------------------------------------- in process: validation and small runs


def in_process_cases(p: Probe, recipe: Path, score_run: Path) -> None:
    root = p.root
    files = root / "inputs"
    files.mkdir()
    missing_yaml = files / "missing.yaml"
    (files / "list.yaml").write_text("- model\n- task\n")
    (files / "unknown-key.yaml").write_text("populaton: 4\n")
    (files / "broken.yaml").write_text("n-test: [1, 2\n")
    (files / "empty.yaml").write_text("")
    (files / "binary.yaml").write_bytes(b"\xff\xfe\x00\x81 not text")
    (files / "wrong-type.yaml").write_text("n-test: lots\n")
    (files / "negative.yaml").write_text("n-test: -5\n")
    (files / "good.yaml").write_text(f"model: {p.model}\ntask: arith\nn-test: 2\nmax-new-tokens: 2\n")
    (files / "int-key.yaml").write_text("1: 2\n")
    (files / "a-file").write_text("not a directory\n")
    (files / "cache-dir").mkdir()
    (files / "rw.py").write_text("def f(completions, **kw):\n    return [0.0 for c in completions]\n")
    a_file = files / "a-file"

    # ---- every method command: the options they share (RunConfig), each refused in one line
    for m in METHODS:
        p.case(m, "--backend tpu", p.tiny(m, "--backend", "tpu"), "error", "--backend", "tpu")
        p.case(m, "--executor dask", p.tiny(m, "--executor", "dask"), "error", "--executor", "dask")
        p.case(m, "--device gpu7", p.tiny(m, "--device", "gpu7"), "error", "--device", "gpu7")
        p.case(m, "--dtype int3", p.tiny(m, "--dtype", "int3"), "error", "--dtype", "int3")
        p.case(m, "--config missing.yaml", [m, "--config", missing_yaml], "error", str(missing_yaml))
        p.case(m, "unknown option --polulation", p.tiny(m, "--polulation", "2"), "error", "--polulation")
        p.case(m, "--n-test abc (not a number)", p.tiny(m, "--n-test", "abc"), "error", "--n-test")
        p.case(m, "--gpu-memory-utilization 1.5", p.tiny(m, "--gpu-memory-utilization", "1.5"), "error")
        p.case(m, "--ray-address without --executor ray", p.tiny(m, "--ray-address", "auto"), "error", "--ray-address")

    # ---- the rest of RunConfig's checks, spread over the commands
    shared = [
        (
            "score",
            "--tensor-parallel-size 4 on a CPU machine",
            ["--tensor-parallel-size", "4"],
            ("--tensor-parallel-size",),
        ),
        (
            "grpo",
            "--tensor-parallel-size 4 on a CPU machine",
            ["--tensor-parallel-size", "4"],
            ("--tensor-parallel-size",),
        ),
        ("eval", "--tensor-parallel-size 0", ["--tensor-parallel-size", "0"], ("--tensor-parallel-size",)),
        ("randopt", "--gpu-memory-utilization 0", ["--gpu-memory-utilization", "0"], ("--gpu-memory-utilization",)),
        ("es", "--gpu-memory-utilization nan", ["--gpu-memory-utilization", "nan"], ("--gpu-memory-utilization",)),
        ("eval", "--gpu-memory-utilization -0.5", ["--gpu-memory-utilization", "-0.5"], ("--gpu-memory-utilization",)),
        ("score", "--batch-size 0", ["--batch-size", "0"], ("--batch-size",)),
        ("fera", "--batch-size -4", ["--batch-size", "-4"], ("--batch-size",)),
        ("eval", "--max-completion-length 0", ["--max-completion-length", "0"], ("--max-completion-length",)),
        (
            "self-consistency",
            "--max-completion-length -1",
            ["--max-completion-length", "-1"],
            ("--max-completion-length",),
        ),
        ("randopt", "--n-support -1", ["--n-support", "-1"], ("--n-support",)),
        ("consolidate", "--n-validation -3", ["--n-validation", "-3"], ("--n-validation",)),
        ("grpo", "--threads -2", ["--threads", "-2"], ("--threads",)),
        ("fgrpo", "--workers 0", ["--workers", "0"], ("--workers",)),
        ("score", "--executor ray --workers 0", ["--executor", "ray", "--workers", "0"], ("--workers",)),
        ("eval", "--report-on train", ["--report-on", "train"], ("--report-on", "train")),
        ("randopt", "--report-on validation with --n-validation 0", ["--report-on", "validation"], ("--n-validation",)),
        ("es", "--report-to wandb (not installed)", ["--report-to", "wandb"], ("wandb",)),
        ("grpo", "--report-to foo", ["--report-to", "foo"], ("foo",)),
        ("eval", "--eval-cache a directory", ["--eval-cache", files / "cache-dir"], (str(files / "cache-dir"),)),
        ("score", "--split-seed 1.5 (not an integer)", ["--split-seed", "1.5"], ("--split-seed",)),
        ("fedcorp", "--seed x", ["--seed", "x"], ("--seed",)),
        ("analyze-rank", "--threads many", ["--threads", "many"], ("--threads",)),
        ("ftis", "--batch-size 0", ["--batch-size", "0"], ("--batch-size",)),
        ("consolidate", "--device cuda:3 on a CPU machine", ["--device", "cuda:3"], ("cuda:3",)),
        ("eval", "--device cpu:1", ["--device", "cpu:1"], ("cpu:1",)),
    ]
    for m, name, extra, frags in shared:
        p.case(m, name, p.tiny(m, *extra), "error", *frags)

    # ---- --executor ray on a command that runs in one process: one line naming --executor local
    for m in ("es", "grpo", "eval", "fera", "self-consistency", "ftis"):
        p.case(
            m,
            "--executor ray refused, naming --executor local",
            p.tiny(m, "--executor", "ray"),
            "error",
            "--executor local",
        )

    # ---- files a new user gets wrong: --config, --output-dir, --model, --task, --reward
    configs = [
        ("score", "--config that is a YAML list", files / "list.yaml", (str(files / "list.yaml"),)),
        ("randopt", "--config with an unknown key", files / "unknown-key.yaml", ("populaton",)),
        ("es", "--config with an unknown key", files / "unknown-key.yaml", ("populaton",)),
        ("eval", "--config that is not valid YAML", files / "broken.yaml", (str(files / "broken.yaml"),)),
        ("grpo", "--config that is a directory", files / "cache-dir", (str(files / "cache-dir"),)),
        ("fera", "--config that is not text", files / "binary.yaml", (str(files / "binary.yaml"),)),
        ("self-consistency", "--config with a wrong type", files / "wrong-type.yaml", ("n", "test")),
        ("consolidate", "--config with a negative size", files / "negative.yaml", ("--n-test",)),
        ("fgrpo", "--config with a key that is a number", files / "int-key.yaml", (str(files / "int-key.yaml"),)),
        ("analyze-rank", "--config that is a YAML list", files / "list.yaml", (str(files / "list.yaml"),)),
        ("ftis", "--config with an unknown key", files / "unknown-key.yaml", ("populaton",)),
        ("fedcorp", "--config that is not valid YAML", files / "broken.yaml", (str(files / "broken.yaml"),)),
    ]
    for m, name, path, frags in configs:
        p.case(m, name, [m, "--config", path], "error", *frags)
    p.case(
        "eval",
        "--config valid YAML (flags give the run directory)",
        ["eval", "--config", files / "good.yaml", "--output-dir", p.run_dir()],
        "ok",
    )
    p.case("eval", "--config empty YAML, all options as flags", p.tiny("eval", "--config", files / "empty.yaml"), "ok")

    for m in ("score", "es", "grpo", "eval", "fedcorp", "fera"):
        argv = [m, *p.small(a_file), *TINY[m]]
        p.case(m, "--output-dir that is a file", argv, "error", str(a_file))
    for m in ("randopt", "self-consistency", "ftis"):
        where = Path("/sys") / f"corp-probe-{m}"  # not writable even by root
        p.case(m, "--output-dir where nothing can be written", [m, *p.small(where), *TINY[m]], "error", str(where))
    nested = a_file / "run"
    p.case(
        "consolidate",
        "--output-dir inside a file",
        [*p.tiny("consolidate"), "--output-dir", nested],
        "error",
        str(a_file),
    )

    no_model = root / "no-such-model"
    for m in ("score", "eval", "grpo", "fgrpo"):
        p.case(m, "--model a directory that does not exist", p.tiny(m, "--model", no_model), "error", "no-such-model")
    p.case(  # issue 57: a path is a directory the user meant, never a hub id to download
        "randopt",
        "--model ./missing: the directory does not exist, no hf download",
        p.tiny("randopt", "--model", "./no-such-model"),
        "error",
        "./no-such-model",
        "does not exist",
        extra=lambda r: "hf download" not in r.stderr,
    )
    p.case("es", "--model a file", p.tiny("es", "--model", a_file), "error", str(a_file))
    for m, spec, frag in (
        ("eval", "nosuchtask", "nosuchtask"),
        ("randopt", "arith:digits=abc", "digits"),
        ("self-consistency", "arith:colour=red", "colour"),
        ("score", f"jsonl:{root / 'missing.jsonl'}", str(root / "missing.jsonl")),
        ("fera", "jsonl:", "jsonl"),
    ):
        p.case(m, f"--task {spec.replace(str(root), '...')}", p.tiny(m, "--task", spec), "error", frag)
    for m, spec, frag in (
        ("score", "nosuchmodule:f", "nosuchmodule"),
        ("eval", f"{files / 'rw.py'}:missing", "missing"),
        ("grpo", "not-a-reward", "not-a-reward"),
    ):
        p.case(m, f"--reward {spec.replace(str(root), '...')}", p.tiny(m, "--reward", spec), "error", frag)

    # ---- population methods: --population, --sigmas, --noise, --race, --from-run
    pop = [
        ("score", "--population 0", ["--population", "0"], ("--population",)),
        ("randopt", "--population -3", ["--population", "-3"], ("--population",)),
        ("score", "--sigmas 0", ["--sigmas", "0"], ("--sigmas",)),
        ("consolidate", "--sigmas inf", ["--sigmas", "inf"], ("--sigmas",)),
        ("randopt", "--sigmas nan", ["--sigmas", "nan"], ("--sigmas",)),
        ("fedcorp", "--sigmas -0.01", ["--sigmas", "-0.01"], ("--sigmas",)),
        ("score", "--sigmas abc", ["--sigmas", "abc"], ("sigmas",)),
        ("analyze-rank", "--sigmas ''", ["--sigmas", ""], ("sigmas",)),
        ("score", "--noise lowrank:r=0", ["--noise", "lowrank:r=0"], ("--noise",)),
        ("randopt", "--noise lowrank:r=02", ["--noise", "lowrank:r=02"], ("02",)),
        ("consolidate", "--noise lowrank", ["--noise", "lowrank"], ("--noise",)),
        ("analyze-rank", "--noise gaussian", ["--noise", "gaussian"], ("gaussian",)),
        ("fedcorp", "--noise lowrank:r=-1", ["--noise", "lowrank:r=-1"], ("--noise",)),
        ("score", "--race foo", ["--race", "foo"], ("--race", "foo")),
        ("randopt", "--race halving --race-eta 1", ["--race", "halving", "--race-eta", "1"], ("--race-eta",)),
        ("consolidate", "--race halving --race-first 0", ["--race", "halving", "--race-first", "0"], ("--race-first",)),
        (
            "score",
            "--race halving --race-ties maybe",
            ["--race", "halving", "--race-ties", "maybe"],
            ("--race-ties", "maybe"),
        ),
        ("randopt", "--race halving --race-keep -1", ["--race", "halving", "--race-keep", "-1"], ("--race-keep",)),
        (
            "score",
            "--from-run a directory that does not exist",
            ["--from-run", root / "nowhere"],
            (str(root / "nowhere"),),
        ),
        ("randopt", "--from-run a file", ["--from-run", a_file], (str(a_file),)),
        (
            "randopt",
            "--from-run with --race halving",
            ["--from-run", score_run, "--race", "halving"],
            ("--from-run", "--race"),
        ),
        (
            "consolidate",
            "--from-run with --race halving",
            ["--from-run", root / "nowhere", "--race", "halving"],
            ("--race",),
        ),
        ("score", "--from-sigmas without --from-run", ["--from-sigmas", "0.05"], ("--from-sigmas",)),
        ("randopt", "--from-sigmas ''", ["--from-run", score_run, "--from-sigmas", ""], ("--from-sigmas",)),
        (
            "analyze-rank",
            "--from-run a directory that does not exist",
            ["--from-run", root / "nowhere"],
            (str(root / "nowhere"),),
        ),
        ("fedcorp", "--from-run (clients score their own)", ["--from-run", score_run], ("--from-run",)),
        ("score", "--include '([' (not a regex)", ["--include", "(["], ("--include",)),
        ("es", "--exclude '*x' (not a regex)", ["--exclude", "*x"], ("--exclude",)),
        ("analyze-rank", "--matrices '(' (not a regex)", ["--matrices", "("], ("--matrices",)),
    ]
    for m, name, extra, frags in pop:
        p.case(m, name, p.tiny(m, *extra), "error", *frags)
    p.case(
        "randopt",
        "--from-sigmas a scale the population does not have",
        p.tiny("randopt", "--from-run", score_run, "--from-sigmas", "0.3"),
        "error",
        "0.3",
    )
    p.case("randopt", "--from-run a scored population (success)", p.tiny("randopt", "--from-run", score_run), "ok")
    p.case("score", "--noise lowrank:r=1 (success)", p.tiny("score", "--noise", "lowrank:r=1"), "ok")
    p.case(  # issue 57: it said "4 different ids, not 4 ids", naming no option
        "score",
        "--split-seed 5 on an existing run names the option and its value",
        ["score", *p.small(score_run), *TINY["score"], "--split-seed", "5"],
        "error",
        "--split-seed (split_seed in Python)",
        "resume it with --split-seed 0",
    )

    # ---- randopt / consolidate
    for m, name, extra, frags in (
        ("randopt", "--top-k 0", ["--top-k", "0"], ("--top-k",)),
        ("randopt", "--top-k 99 with --population 2", ["--top-k", "99"], ("--top-k", "--population")),
        ("randopt", "--top-k abc", ["--top-k", "abc"], ("top",)),
        ("consolidate", "--top-k -1", ["--top-k", "-1"], ("--top-k",)),
        ("consolidate", "--quantiles 1.5", ["--quantiles", "1.5"], ("--quantiles",)),
        ("consolidate", "--betas -1", ["--betas", "-1"], ("--betas",)),
        ("consolidate", "--alphas 0", ["--alphas", "0"], ("--alphas",)),
        ("consolidate", "--alphas nan", ["--alphas", "nan"], ("--alphas",)),
        ("consolidate", "--preset fast", ["--preset", "fast"], ("--preset", "fast")),
        ("consolidate", "--merge-rules nope", ["--merge-rules", "nope"], ("--merge-rules",)),
        ("consolidate", "--merge-rules pass1,pass1", ["--merge-rules", "pass1,pass1"], ("--merge-rules",)),
        ("consolidate", "--compat approx", ["--compat", "approx"], ("--compat", "approx")),
        ("consolidate", "--gate-z inf", ["--gate-z", "inf"], ("--gate-z",)),
        ("consolidate", "--stage2-rounds -1", ["--stage2-rounds", "-1"], ("--stage2-rounds",)),
        ("consolidate", "--pc-mix 2", ["--pc-mix", "2"], ("--pc-mix",)),
        ("consolidate", "--local-population 1", ["--local-population", "1"], ("--local-population",)),
        ("consolidate", "--gram-memory-gb 0", ["--gram-memory-gb", "0"], ("--gram-memory-gb",)),
        ("consolidate", "--merge-memory-gb -1", ["--merge-memory-gb", "-1"], ("--merge-memory-gb",)),
        ("consolidate", "--low-rank sometimes", ["--low-rank", "sometimes"], ("--low-rank", "sometimes")),
        ("consolidate", "--low-rank 0", ["--low-rank", "0"], ("--low-rank",)),
        (
            "consolidate",
            "--low-rank auto with --stage2-rounds 1",
            ["--low-rank", "auto", "--stage2-rounds", "1"],
            ("--low-rank", "--stage2-rounds"),
        ),
        ("consolidate", "--export-lora without a low-rank update", ["--export-lora"], ("--export-lora",)),
        ("consolidate", "--lora-r -1", ["--lora-r", "-1"], ("--lora-r",)),
        ("consolidate", "--rank-from without --low-rank auto", ["--rank-from", score_run], ("--rank-from",)),
        (
            "consolidate",
            "--rank-from a directory that does not exist",
            ["--low-rank", "auto", "--rank-from", root / "nowhere"],
            (str(root / "nowhere"),),
        ),
        ("consolidate", "--from-run a run without a population", ["--from-run", recipe.parent], (str(recipe.parent),)),
    ):
        p.case(m, name, p.tiny(m, *extra), "error", *frags)

    # ---- es
    for name, extra, frags in (
        ("--sigma 0", ["--sigma", "0"], ("--sigma",)),
        ("--sigma -0.1", ["--sigma", "-0.1"], ("--sigma",)),
        ("--sigma inf", ["--sigma", "inf"], ("--sigma",)),
        ("--learning-rate nan", ["--learning-rate", "nan"], ("--learning-rate",)),
        ("--learning-rate inf", ["--learning-rate", "inf"], ("--learning-rate",)),
        ("--iterations 0", ["--iterations", "0"], ("--iterations",)),
        ("--population-per-iteration 1", ["--population-per-iteration", "1"], ("--population-per-iteration",)),
        (
            "--antithetic with --population-per-iteration 3",
            ["--antithetic", "--population-per-iteration", "3"],
            ("--population-per-iteration",),
        ),
        ("--fitness best", ["--fitness", "best"], ("--fitness", "best")),
        ("--prompts-per-iteration -1", ["--prompts-per-iteration", "-1"], ("--prompts-per-iteration",)),
        ("--noise lowrank:r=0", ["--noise", "lowrank:r=0"], ("--noise",)),
        ("--sigma abc", ["--sigma", "abc"], ("--sigma",)),
    ):
        p.case("es", name, p.tiny("es", *extra), "error", *frags)

    # ---- grpo (and the GRPO options fgrpo and ftis share)
    for m, name, extra, frags in (
        ("grpo", "--max-steps 0", ["--max-steps", "0"], ("--max-steps",)),
        ("grpo", "--learning-rate 0", ["--learning-rate", "0"], ("--learning-rate",)),
        ("grpo", "--learning-rate nan", ["--learning-rate", "nan"], ("--learning-rate",)),
        ("grpo", "--temperature 0", ["--temperature", "0"], ("--temperature",)),
        ("grpo", "--temperature inf", ["--temperature", "inf"], ("--temperature",)),
        ("grpo", "--beta -1", ["--beta", "-1"], ("--beta",)),
        ("grpo", "--loss foo", ["--loss", "foo"], ("foo",)),
        ("grpo", "--loss-type token", ["--loss-type", "token"], ("--loss-type", "token")),
        ("grpo", "--scale-rewards batch", ["--scale-rewards", "batch"], ("--scale-rewards", "batch")),
        ("grpo", "--lora-r -1", ["--lora-r", "-1"], ("--lora-r",)),
        ("grpo", "--num-generations 1", ["--num-generations", "1"], ("--num-generations",)),
        (
            "grpo",
            "--gradient-accumulation-steps 3 not dividing 1 x 2",
            ["--gradient-accumulation-steps", "3"],
            ("--gradient-accumulation-steps",),
        ),
        ("grpo", "--epsilon -0.1", ["--epsilon", "-0.1"], ("--epsilon",)),
        ("grpo", "--save-steps 0", ["--save-steps", "0"], ("--save-steps",)),
        ("grpo", "--num-iterations 0", ["--num-iterations", "0"], ("--num-iterations",)),
        ("fgrpo", "--rounds 0", ["--rounds", "0"], ("--rounds",)),
        ("fgrpo", "--clients 0", ["--clients", "0"], ("--clients",)),
        ("fgrpo", "--split-by region", ["--split-by", "region"], ("--split-by", "region")),
        ("fgrpo", "--aggregation median", ["--aggregation", "median"], ("--aggregation", "median")),
        ("fgrpo", "--tau 0", ["--tau", "0"], ("--tau",)),
        ("fgrpo", "--ema 1", ["--ema", "1"], ("--ema",)),
        ("fgrpo", "--ema -0.1", ["--ema", "-0.1"], ("--ema",)),
        ("fgrpo", "--executor ray --workers 0", ["--executor", "ray", "--workers", "0"], ("--workers",)),
        ("fgrpo", "--local-steps 0", ["--local-steps", "0"], ("--local-steps",)),
        ("ftis", "--n-nodes 1", ["--n-nodes", "1"], ("--n-nodes",)),
        ("ftis", "--nodes with one model", ["--nodes", p.model], ("--nodes",)),
        ("ftis", "--tis-cap 0", ["--tis-cap", "0"], ("--tis-cap",)),
        ("ftis", "--tis-cap inf", ["--tis-cap", "inf"], ("--tis-cap",)),
        ("ftis", "--kl-filter 0", ["--kl-filter", "0"], ("--kl-filter",)),
        ("ftis", "--eval-nodes 5 of 2 nodes", ["--eval-nodes", "5"], ("--eval-nodes",)),
        ("ftis", "--eval-every 0", ["--eval-every", "0"], ("--eval-every",)),
        ("ftis", "--loss cov (not supported)", ["--loss", "cov"], ("--loss",)),
        ("ftis", "--beta 0.1 (not supported)", ["--beta", "0.1"], ("--beta",)),
    ):
        p.case(m, name, p.tiny(m, *extra), "error", *frags)

    # ---- eval, self-consistency
    for m, name, extra, frags in (
        ("eval", "--pass-k 0", ["--pass-k", "0"], ("--pass-k",)),
        (
            "eval",
            "--pass-k 4 --num-generations 2",
            ["--pass-k", "4", "--num-generations", "2"],
            ("--num-generations", "--pass-k"),
        ),
        ("eval", "--pass-k 2 --temperature 0", ["--pass-k", "2", "--temperature", "0"], ("--temperature",)),
        ("eval", "--pass-k abc", ["--pass-k", "abc"], ("pass",)),
        ("eval", "--num-generations x", ["--num-generations", "x"], ("--num-generations",)),
        ("self-consistency", "--vote-k 0", ["--vote-k", "0"], ("--vote-k",)),
        ("self-consistency", "--vote-k abc", ["--vote-k", "abc"], ("k",)),
        ("self-consistency", "--temperature 0", ["--temperature", "0"], ("--temperature",)),
        ("self-consistency", "--temperature -1", ["--temperature", "-1"], ("--temperature",)),
    ):
        p.case(m, name, p.tiny(m, *extra), "error", *frags)
    p.case("eval", "tiny model, defaults otherwise (success)", p.tiny("eval"), "ok")

    # ---- fedcorp, fera, analyze-rank
    for m, name, extra, frags in (
        ("fedcorp", "--clients 0", ["--clients", "0"], ("--clients",)),
        ("fedcorp", "--split-by region", ["--split-by", "region"], ("--split-by", "region")),
        ("fedcorp", "--combine max", ["--combine", "max"], ("--combine", "max")),
        ("fedcorp", "--min-accept 0", ["--min-accept", "0"], ("--min-accept",)),
        ("fedcorp", "--min-accept 1.5", ["--min-accept", "1.5"], ("--min-accept",)),
        ("fedcorp", "--stage2-rounds 1 (stage 2 is not federated)", ["--stage2-rounds", "1"], ("--stage2-rounds",)),
        ("fedcorp", "--quantiles -0.5", ["--quantiles", "-0.5"], ("--quantiles",)),
        ("fedcorp", "--population 0", ["--population", "0"], ("--population",)),
        ("fera", "--clients 0", ["--clients", "0"], ("--clients",)),
        ("fera", "--shots 0", ["--shots", "0"], ("--shots",)),
        ("fera", "--rounds 0", ["--rounds", "0"], ("--rounds",)),
        ("fera", "--num-generations 1 with disagreement", ["--num-generations", "1"], ("--num-generations",)),
        ("fera", "--uncertainty vibes", ["--uncertainty", "vibes"], ("--uncertainty", "vibes")),
        ("fera", "--temperature-u 0", ["--temperature-u", "0"], ("--temperature-u",)),
        ("fera", "--temperature-u inf", ["--temperature-u", "inf"], ("--temperature-u",)),
        ("fera", "--sample-temperature 0", ["--sample-temperature", "0"], ("--sample-temperature",)),
        ("fera", "--split-by region", ["--split-by", "region"], ("region",)),
        ("analyze-rank", "--ranks 0", ["--ranks", "0"], ("--ranks",)),
        ("analyze-rank", "--splits 0", ["--splits", "0"], ("--splits",)),
        ("analyze-rank", "--permutations 0", ["--permutations", "0"], ("--permutations",)),
        ("analyze-rank", "--significance 1", ["--significance", "1"], ("--significance",)),
        ("analyze-rank", "--significance 0.001 with 19 permutations", ["--significance", "0.001"], ("--permutations",)),
        ("analyze-rank", "--power-sims -1", ["--power-sims", "-1"], ("--power-sims",)),
        ("analyze-rank", "--power-rank 0", ["--power-rank", "0"], ("--power-rank",)),
        ("analyze-rank", "--memory-mb 0", ["--memory-mb", "0"], ("--memory-mb",)),
        ("analyze-rank", "--splits abc", ["--splits", "abc"], ("--splits",)),
    ):
        p.case(m, name, p.tiny(m, *extra), "error", *frags)

    # ---- apply
    bad_json = files / "recipe-not-json.json"
    bad_json.write_text("{'kind': 'es',")
    good = json.loads(recipe.read_text())
    wrong_kind = files / "recipe-wrong-kind.json"
    wrong_kind.write_text(json.dumps({**good, "kind": "lottery"}))
    a_list = files / "recipe-list.json"
    a_list.write_text("[1, 2, 3]")
    nan_sigma = files / "recipe-nan.json"
    nan_sigma.write_text(json.dumps({**good, "components": [{"seed": 1, "sigma": float("nan"), "coef": 1.0}]}))
    no_base = files / "recipe-no-base.json"
    no_base.write_text(json.dumps({k: v for k, v in good.items() if k != "base_model"}))
    out = root / "applied-out"
    missing = files / "missing-recipe.json"
    for name, argv, frags in (
        ("a recipe that does not exist", ["apply", missing, "--out", out], (str(missing),)),
        ("a recipe that is not JSON", ["apply", bad_json, "--out", out], (str(bad_json),)),
        ("a recipe JSON of a wrong kind", ["apply", wrong_kind, "--out", out], ("lottery",)),
        ("a recipe JSON that is a list", ["apply", a_list, "--out", out], (str(a_list),)),
        ("a recipe with a NaN sigma", ["apply", nan_sigma, "--out", out], ("sigma",)),
        ("a recipe without base_model", ["apply", no_base, "--out", out], ("base_model",)),
        ("a recipe that is a directory", ["apply", recipe.parent, "--out", out], (str(recipe.parent),)),
        ("no --out", ["apply", recipe], ("--out",)),
        ("no recipe at all", ["apply"], ()),
        ("--out that is a file", ["apply", recipe, "--out", a_file], (str(a_file),)),
        ("--out inside its run directory", ["apply", recipe, "--out", recipe.parent / "again"], (str(recipe.parent),)),
        ("--out the base model's directory", ["apply", recipe, "--out", p.model], (str(p.model),)),
        ("--out the current directory", ["apply", recipe, "--out", "."], ()),
        (
            "--model a directory that does not exist",
            ["apply", recipe, "--out", out, "--model", no_model],
            ("no-such-model",),
        ),
        (
            "--out where nothing can be written",
            ["apply", recipe, "--out", "/sys/corp-probe-apply"],
            ("/sys/corp-probe-apply",),
        ),
    ):
        p.case("apply", name, argv, "error", *frags)
    p.case("apply", "the ES recipe to a new --out (success)", ["apply", recipe, "--out", root / "applied-ok"], "ok")
    p.case(
        "apply",
        "the same --out again replaces corp's own model (success)",
        ["apply", recipe, "--out", root / "applied-ok"],
        "ok",
    )

    # ---- bench
    bench_dir = files / "bench"
    bench_dir.mkdir()

    def bench_yaml(name: str, body: str) -> Path:
        path = bench_dir / f"{name}.yaml"
        path.write_text(body)
        return path

    ok_bench = (
        f"name: probe-bench\nmodel: {p.model}\ntasks: [arith]\nseeds: [0]\nbudgets: [1e9]\n"
        f"results_dir: {root / 'bench-results'}\nwork_dir: {root / 'bench-work'}\nmethods: {{randopt: {{}}}}\n"
    )
    good_bench = bench_yaml("good", ok_bench)
    for i, (name, body, frags) in enumerate(
        (
            ("budgets: [-1]", ok_bench.replace("budgets: [1e9]", "budgets: [-1]"), ("budgets",)),
            ("budgets: [.inf]", ok_bench.replace("budgets: [1e9]", "budgets: [.inf]"), ("budgets",)),
            ("tasks: []", ok_bench.replace("tasks: [arith]", "tasks: []"), ("tasks",)),
            ("methods: {}", ok_bench.replace("methods: {randopt: {}}", "methods: {}"), ("methods",)),
            ("a method spec with a typo", ok_bench.replace("{randopt: {}}", "{randopt: {optons: {}}}"), ("randopt",)),
            ("settings: [weird]", ok_bench + "settings: [weird]\n", ("weird",)),
            ("hyperparameters: tuned", ok_bench + "hyperparameters: tuned\n", ("tuned",)),
            ("name: ../escape", ok_bench.replace("name: probe-bench", "name: ../escape"), ("../escape",)),
            ("population: 0", ok_bench + "population: 0\n", ("population",)),
            ("an unknown key", ok_bench + "budget: 3\n", ("budget",)),
            ("a YAML list", "- a\n- b\n", ()),
            ("compare with one seed", ok_bench + "compare: [[randopt, es]]\n", ("seed",)),
            ("budgets: [3e8, 3e8] (issue 57)", ok_bench.replace("[1e9]", "[3e8, 3e8]"), ("budgets repeat 3e+08",)),
        )
    ):
        p.case("bench", f"--config with {name}", ["bench", "--config", bench_yaml(f"b{i}", body)], "error", *frags)
    for name, argv, frags in (
        ("no --config", ["bench"], ("--config",)),
        ("--config missing.yaml", ["bench", "--config", missing_yaml], (str(missing_yaml),)),
        ("--threads -1", ["bench", "--config", good_bench, "--threads", "-1"], ("threads",)),
        ("--threads abc", ["bench", "--config", good_bench, "--threads", "abc"], ("--threads",)),
        ("--report-to wandb (not installed)", ["bench", "--config", good_bench, "--report-to", "wandb"], ("wandb",)),
        ("--report-to foo", ["bench", "--config", good_bench, "--report-to", "foo"], ("foo",)),
        (
            "--task that the config does not have",
            ["bench", "--config", good_bench, "--task", "gsm8k", "--report-only"],
            ("gsm8k",),
        ),
        (
            "--methods that the config does not have",
            ["bench", "--config", good_bench, "--methods", "nosuch", "--report-only"],
            ("nosuch",),
        ),
    ):
        p.case("bench", name, argv, "error", *frags)
    p.case(
        "bench", "--readme-section before any cell ran", ["bench", "--config", good_bench, "--readme-section"], "clean"
    )
    p.case("bench", "--report-only before any cell ran", ["bench", "--config", good_bench, "--report-only"], "clean")
    # issue 57: a config the plan refuses leaves no results/NAME/cells/; --report-only keeps "Made by"
    leaky = ok_bench.replace("probe-bench", "probe-leak").replace("{randopt: {}}", "{randopt: {options: {nosuch: 1}}}")
    p.case(
        "bench",
        "an option the plan refuses leaves no results directory",
        ["bench", "--config", bench_yaml("leak", leaky)],
        "error",
        "nosuch",
        extra=lambda r: not (root / "bench-results" / "probe-leak").exists(),
    )
    table = root / "bench-results" / "probe-bench" / "table.md"

    def made_by() -> str | None:
        return table.read_text().split("Made by `", 1)[1].split("`")[0] if table.exists() else None

    before = made_by()  # the report-only above recorded its command
    p.case(
        "bench",
        "--report-only --threads 1 keeps the recorded Made by line",
        ["bench", "--config", good_bench, "--report-only", "--threads", "1"],
        "ok",
        extra=lambda r: before is None or made_by() == before,
    )

    # ---- the plain commands and help
    p.case("models", "corp models", ["models"], "ok", extra=lambda r: bool(r.stdout.strip()))
    p.case("models", "corp models with an extra argument", ["models", "all"], "error", "all")
    p.case("tasks", "corp tasks", ["tasks"], "ok", extra=lambda r: "arith" in r.stdout)
    p.case("tasks", "corp tasks --verbose (no such option)", ["tasks", "--verbose"], "error", "--verbose")
    p.case("corp", "corp (no command) prints the help", [], "ok", extra=lambda r: "Commands" in r.stdout)
    p.case("corp", "corp trian (a typo of a command)", ["trian"], "error", "trian")
    for m in [*METHODS, "apply", "bench", "models", "tasks"]:
        p.case(m, "--help", [m, "--help"], "ok", extra=lambda r: "Usage" in r.stdout)


# ---------------------------------------------------------------- issue 57: custom data and the Python API


def api_case(p: Probe, name: str, call, expect: type | None, *fragments: str, extra=None) -> None:
    """Run `call()` (corp's Python API) in the probe's directory and check it: it raises `expect`, one
    line naming every fragment; or (expect None) it returns and `extra(result)` holds."""
    if p.only and not any(part in f"api {name}" for part in p.only.split("|")):
        return
    if p.listing:
        p.listed.append(("api", name))
        print(f"[api] {name}")
        return
    here = os.getcwd()
    os.chdir(p.root)
    try:
        got = call()
        ok, why = expect is None and (extra is None or bool(extra(got))), f"returned {got!r}"[:900]
    except Exception as exc:  # noqa: BLE001 -- any escape is the case's outcome, checked below
        msg = str(exc)
        ok = expect is not None and isinstance(exc, expect) and "\n" not in msg and all(f in msg for f in fragments)
        why = "".join(traceback.format_exception(exc))[-1500:]
    finally:
        os.chdir(here)
    p.check("api", name, ok, why)


def issue57_cases(p: Probe) -> None:
    import corp

    files = p.root / "inputs-57"
    files.mkdir(exist_ok=True)
    os.environ["CORP_CACHE"] = str(p.root / "cache")  # the API's datasets: here, not in the user's cache
    rows = [{"prompt": f"{i} + {i} =", "answer": str(2 * i)} for i in range(8)]

    def jsonl(name: str, records: list) -> Path:
        (files / name).write_text("".join(json.dumps(r) + "\n" for r in records))
        return files / name

    # a prompt longer than the tiny model's context (256 positions): one line naming the row, no generation
    long = jsonl("long.jsonl", [*rows[:3], {"prompt": "1" * 5000, "answer": "1"}])
    argv = p.tiny("score", "--task", f"jsonl:{long}", "--n-support", "2", "--n-test", "2")
    p.case("score", "a jsonl prompt longer than the context (issue 57)", argv, "error", "line-4", "context of 256")
    # duplicate rows: dropped with a note, no prompt in two splits
    dup = jsonl("dup.jsonl", rows[:4] * 2)
    run = p.run_dir()
    argv = ["score", *p.small(run), *TINY["score"], "--task", f"jsonl:{dup}"]

    def disjoint(res) -> bool:
        ids = [i for s in json.loads((run / "splits.json").read_text()).values() if isinstance(s, list) for i in s]
        prompts = [(rows[:4] * 2)[int(i.split("-")[1]) - 1]["prompt"] for i in ids]
        return "dropped" in res.stderr and len(prompts) == len(set(prompts)) == 4

    p.case("score", "duplicate jsonl rows: no prompt in two splits (issue 57)", argv, "ok", extra=disjoint)

    small = dict(n_support=2, n_probe=0, n_validation=0, n_test=2, max_completion_length=2)
    small.update(population=2, sigmas=[0.05], top_k=[1])

    def randopt(reward, data=rows, **kw):
        return lambda: corp.train_randopt(str(p.model), data, reward, **{**small, **kw})

    def tiny_object():
        from transformers import AutoModelForCausalLM

        return corp.train_randopt(AutoModelForCausalLM.from_pretrained(p.model), rows, _flat)

    api_case(p, "train_randopt(<a model object>) (issue 57)", tiny_object, TypeError, "model", "save_pretrained")
    (files / "a-file").write_text("")

    def cache_under_a_file():
        os.environ["CORP_CACHE"] = str(files / "a-file" / "cache")
        try:
            return randopt(_flat, [*rows, {"prompt": "new", "answer": "1"}])()  # a dataset not cached yet
        finally:
            os.environ["CORP_CACHE"] = str(p.root / "cache")

    api_case(p, "a CORP_CACHE that cannot be written (issue 57)", cache_under_a_file, corp.CorpError, "CORP_CACHE")
    both = randopt(_flat, run_dir=str(files / "a"), output_dir=str(files / "b"))
    api_case(p, "run_dir=A with output_dir=B (issue 57)", both, ValueError, "run_dir", "output_dir")
    for value, shown in ((float("nan"), "nan (float)"), ("1.0", "'1.0' (str)"), ("2d", "ndarray of shape (1, 2)")):
        api_case(p, f"a reward returning {shown} (issue 57)", randopt(_returning(value)), corp.CorpError, shown)
    bad = [*rows[:3], {"prompt": "p", "answer": ["4"]}, *rows[4:]]
    api_case(p, "an answer of the wrong type (issue 57)", randopt(_flat, bad), corp.CorpError, "row 3", "'answer'")
    # a module-level global the reward reads changes between two runs in one directory: never its old rows
    out = str(files / "global-run")
    first = randopt(_global_scale, output_dir=out)
    api_case(p, "a reward reading a global, first run (issue 57)", first, None)

    def changed():
        global SCALE
        SCALE = 9.0
        try:
            return [r["reward"] for r in randopt(_global_scale, output_dir=out, population=4)().population()]
        except corp.CorpError as exc:  # refusing the changed reward's resume is right too
            return str(exc)
        finally:
            SCALE = 1.0

    fresh = lambda got: isinstance(got, str) or set(got) == {9.0}  # noqa: E731
    api_case(p, "the global changed: no stale rows resumed (issue 57)", changed, None, extra=fresh)
    machine_paths_cases(p, rows)


def machine_paths_cases(p: Probe, rows: list) -> None:
    """Issue 57: an API run's name, card and corp_model.json name nothing of the machine; the card's
    reproduce line runs (from Python: the rows and the reward are the user's to supply)."""
    import corp

    sizes = dict(n_support=2, n_probe=2, n_validation=2, n_test=2, max_completion_length=2, gate_z=-10.0)
    made: list = []

    def consolidate():
        made.append(corp.train_corp(str(p.model), rows, _flat, population=2, sigmas=[0.05], top_k=[1], **sizes))
        return made[-1]

    def nothing_of_the_machine(result) -> bool:
        card = (p.root / result.model_path / "README.md").read_text()
        return result.run_dir.name.startswith("jsonl-dataset-") and str(p.root) not in card and "DATASET" in card

    api_case(
        p,
        "an API run and its card name no path of the machine (issue 57)",
        consolidate,
        None,
        extra=nothing_of_the_machine,
    )
    if not (made or p.listing):
        return  # the run failed (its case says why): nothing to reproduce or apply
    run_dir = (p.root / made[0].run_dir).resolve() if made else p.root

    def reproduce():
        import re

        card = (run_dir / "model" / "README.md").read_text()
        code = re.search(r"```python\nimport corp  # in this directory\n\n(corp\.train\(.*\))\n```", card).group(1)
        os.environ["CORP_CACHE"] = str(p.root / "another-cache")  # another machine
        here = os.getcwd()
        os.chdir(run_dir / "model")
        try:
            out = str(p.root / "reproduced")
            again = eval(code[:-1] + f", output_dir={out!r})", {"corp": corp, "DATASET": rows, "REWARD": _flat})
        finally:
            os.chdir(here)
            os.environ["CORP_CACHE"] = str(p.root / "cache")
        return [json.loads((d / "splits.json").read_text())["test"] for d in (run_dir, again.run_dir)]

    api_case(
        p,
        "the card's reproduce line runs, on the run's test examples (issue 57)",
        reproduce,
        None,
        extra=lambda ids: ids[0] == ids[1],
    )

    def applied():
        from corp.algorithms.recipe import apply_recipe

        out = apply_recipe(run_dir / "recipe.json", p.root / "applied-57")
        return (out / "corp_model.json").read_text()

    api_case(
        p,
        "corp_model.json from apply names no absolute path (issue 57)",
        applied,
        None,
        extra=lambda text: str(p.root) not in text and "base_weights_hash" in text,
    )


SCALE = 1.0  # read by `_global_scale` (issue 57's stale-resume case)


def _global_scale(completions, **kw):
    return [SCALE for _ in completions]


def _flat(completions, **kw):
    return [0.5 for _ in completions]


def _returning(value):
    def reward(completions, **kw):
        import numpy as np

        return [np.array([[1.0, 2.0]]) if value == "2d" else value for _ in completions]

    return reward


# ---------------------------------------------------------------- in fresh processes: faults, kills, users


def subprocess_cases(p: Probe, recipe: Path) -> None:
    root = p.root
    es_run = recipe.parent

    # 1. --overwrite replaces only corp's model directories
    for case in ("user-file", "copied-run-dir"):
        out = root / f"out-{case}"
        (out / "sub").mkdir(parents=True)
        named = out / "sub" / ("notes.txt" if case == "user-file" else "run_status.json")
        named.write_text("{}")
        res = p.corp("apply", recipe, "--out", out, "--overwrite")
        ok, why = p.one_line(res, str(named.parent if case != "user-file" else named))
        p.check("apply", f"apply --overwrite refuses a {case} and deletes nothing", ok and named.exists(), why)

    # 2. a full disk in the tokenizers library: one line naming the path, the run marked failed
    res = p.corp("apply", recipe, "--out", root / "full", fault="tokenizer-full")
    ok, why = p.one_line(res, str(root / "full"), "No space left on device")
    p.check(
        "apply", "apply: tokenizer 'os error 28' is one line naming --out", ok and not (root / "full").exists(), why
    )
    full_run = root / "es-full"
    res = p.corp(*es_args(p, full_run, "--report-to", "tensorboard"), fault="tokenizer-full")
    ok, why = p.one_line(res, str(full_run / "model"), "No space left on device")
    status = json.loads((full_run / "run_status.json").read_text()).get("status") if full_run.is_dir() else None
    p.check("es", "es --report-to tensorboard: tokenizer full disk, run marked failed", ok and status == "failed", why)

    # 3. a dead process's temporary directory beside any target is removed
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket

    stale = root / f".other.tmp-{dead.pid}-probe000"
    stale.mkdir()
    (stale / ".corp-partial").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    live = root / f".other.tmp-{os.getpid()}-probe001"
    live.mkdir()
    (live / ".corp-partial").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    res = p.corp("apply", recipe, "--out", root / "applied")
    p.check(
        "apply",
        "a dead apply's .NAME.tmp-PID-* goes, a live one's stays",
        res.returncode == 0 and not stale.exists() and live.exists(),
        res.stderr,
    )

    # 4. cards: --allow-mismatch says so first; a merged/other-run recipe borrows nothing
    edited = json.loads(recipe.read_text())
    edited["components"] = [*edited["components"], {"seed": 5, "sigma": 0.01, "coef": 1.0}]  # other weights
    (root / "edited.json").write_text(json.dumps(edited))
    res = p.corp("apply", root / "edited.json", "--out", root / "mismatch", "--allow-mismatch")
    card = (root / "mismatch" / "README.md").read_text() if res.returncode == 0 else ""
    head = card.split("## Base model")[0]
    p.check(
        "apply", "--allow-mismatch card states the mismatch up front", "--allow-mismatch" in head, res.stderr + head
    )

    # 5. silently wrong options
    cases = [
        (es_args(p, root / "x1", "--report-to", "tensorboard,tensorboard"), ("tensorboard twice",)),
        (["eval", *p.small(root / "x2"), "--report-to", "tensorboard"], ("--report-to",)),  # eval logs nothing
        (["score", *p.small(root / "x3"), "--noise", "lowrank:r=1_0"], ("r=1_0",)),
        (["score", *p.small(root / "x4"), "--noise", "corp-lowrank-v1:r=02"], ("r=02",)),
    ]
    (root / "both.yaml").write_text("max-new-tokens: 4\nmax_new_tokens: 8\n")
    cases.append(
        (["randopt", "--model", p.model, "--config", root / "both.yaml"], ("max-new-tokens", "max_new_tokens"))
    )
    (root / "seeds.yaml").write_text("name: b\nseeds: [0, 0]\nbudgets: [1e9]\nmethods: {randopt: {}}\n")
    cases.append((["bench", "--config", root / "seeds.yaml"], ("repeat 0",)))
    for argv, fragments in cases:
        ok, why = p.one_line(p.corp(*argv), *fragments)
        p.check(str(argv[0]), f"refused in one line: {' '.join(map(str, argv[:1] + argv[-2:]))}", ok, why)

    # 6. a damaged bench record names itself; Ctrl-C fits the command; the same reward named two ways
    bench = root / "bench.yaml"
    bench.write_text(
        f"name: probe\nmodel: {p.model}\ntasks: [arith]\nseeds: [0]\nbudgets: [1e9]\n"
        f"results_dir: {root / 'results'}\nwork_dir: {root / 'work'}\nmethods: {{randopt: {{options: {{top_k: [1]}}}}}}\n"
    )
    (root / "results" / "probe" / "cells").mkdir(parents=True)
    torn = root / "results" / "probe" / "cells" / "torn.json"
    torn.write_text('{"status": "do')
    ok, why = p.one_line(p.corp("bench", "--config", bench), str(torn), "move it aside")
    p.check("bench", "a truncated cells/*.json is named with what to do", ok, why)
    torn.unlink()
    stranger = torn.with_name("mine.json")  # parses, but is no cell record (issue 57: it was rerun and written over)
    stranger.write_text('{"note": "mine"}')
    ok, why = p.one_line(p.corp("bench", "--config", bench), str(stranger), "move it aside")
    kept = stranger.read_text() == '{"note": "mine"}'
    p.check("bench", "a cells/*.json that is no cell record is named and kept", ok and kept, why)
    stranger.unlink()
    for argv in (["apply", recipe, "--out", root / "ctrl-c"], ["self-consistency", *p.small(root / "sc")]):
        res = p.corp(*argv, fault="ctrl-c")
        said = [ln for ln in res.stderr.splitlines() if ln.startswith("interrupted")]
        ok = res.returncode == 130 and len(said) == 1 and "specialist" not in said[0]
        p.check(str(argv[0]), f"Ctrl-C in corp {argv[0]} says what fits it", ok, res.stderr)
    (root / "rw.py").write_text("def f(completions, **kw):\n    return [len(c) / 10 for c in completions]\n")
    score = ["score", *p.small(root / "rw-run"), "--population", "2", "--sigmas", "0.05"]
    first = p.corp(*score, "--reward", "rw.py:f")
    again = p.corp(*score, "--reward", f"{root}/rw.py:f")
    p.check(
        "score",
        "rw.py:f and /abs/rw.py:f are one reward on resume",
        first.returncode == 0 and again.returncode == 0,
        first.stderr + again.stderr,
    )

    # 7. Ctrl-C in a method: one `interrupted` line naming its --output-dir, exit 130
    for m in ("es", "score", "grpo"):
        run = root / f"ctrl-c-{m}"
        res = p.corp(m, *p.small(run), *TINY[m], fault="ctrl-c")
        said = [ln for ln in res.stderr.splitlines() if ln.startswith("interrupted")]
        ok = res.returncode == 130 and len(said) == 1 and str(run) in said[0] and "Traceback" not in res.stderr
        p.check(
            m, f"Ctrl-C in corp {m} is one line naming its --output-dir", ok, f"exit {res.returncode}; {res.stderr}"
        )

    # 8. a full disk while grpo saves its model: one line naming the place, no traceback
    run = root / "grpo-full"
    res = p.corp("grpo", *p.small(run), *TINY["grpo"], fault="tokenizer-full")
    ok, why = p.one_line(res, "No space left on device", str(run))
    p.check("grpo", "grpo: tokenizer 'os error 28' while saving is one line naming the run", ok, why)

    # 9. kill -9 in the middle of a run, then the same command resumes and finishes
    run = root / "killed-es"
    argv = es_args(p, run, "--iterations", "40")
    env = {**os.environ, **ENV, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "corp.cli", *map(str, argv)],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and not (run / "metrics.jsonl").exists():
        time.sleep(0.05)  # the first iteration is logged: kill it in the middle of the others
    killed = proc.poll() is None
    if killed:
        proc.kill()
    proc.wait()
    res = p.corp(*argv)
    ok = killed and res.returncode == 0 and (run / "recipe.json").is_file() and "Traceback" not in res.stderr
    p.check(
        "es",
        "kill -9 mid-run, then the same command resumes to the end",
        ok,
        f"killed mid-run: {killed}; rerun exit {res.returncode}; {res.stderr}",
    )

    # 10. a user who cannot write: the run directory of another user, apply --out in a read-only place
    if os.geteuid() == 0 and shutil.which("setpriv"):
        user = 65534  # nobody
        (root / "home").mkdir(exist_ok=True)
        os.chmod(root / "home", 0o777)
        os.chmod(root, 0o755)
        for d in (p.model, es_run, root / "inputs"):
            for x in [d, *d.rglob("*")]:
                os.chmod(x, 0o755 if x.is_dir() else 0o644)
    else:  # not root: a directory without write permission is read-only for us already
        user = None
    locked = root / "read-only"
    locked.mkdir()
    shutil.copytree(es_run, locked / "es-run")
    for x in [locked, *locked.rglob("*")]:
        os.chmod(x, 0o555 if x.is_dir() else 0o444)
    res = p.corp(*es_args(p, locked / "es-run"), user=user)
    ok, why = p.one_line(res, str(locked / "es-run"))
    p.check("es", "resume in a read-only run directory: one line naming it", ok, why)
    res = p.corp("score", *p.small(locked / "new-run"), *TINY["score"], user=user)
    ok, why = p.one_line(res, str(locked / "new-run"))
    p.check("score", "a new --output-dir inside a read-only directory: one line naming it", ok, why)
    res = p.corp("apply", recipe, "--out", locked / "model", user=user)
    ok, why = p.one_line(res, str(locked))
    p.check("apply", "apply --out inside a read-only directory: one line naming it", ok, why)
    for x in [locked, *locked.rglob("*")]:
        os.chmod(x, 0o755 if x.is_dir() else 0o644)
    own_files_cases(p, recipe)
    ray_cases(p)


def ray_cases(p: Probe) -> None:
    """Issue 57: a local Ray asked for more workers than the machine's CPUs says so in one line before
    work; the Ray corp started leaves no process and no session_* directory (tens of seconds)."""
    try:
        import psutil
        import ray  # noqa: F401
    except ImportError:
        return
    cpus = len(os.sched_getaffinity(0))
    before = {d.name for d in Path(tempfile.gettempdir()).glob("corp-ray-*")}
    run = p.root / "ray-oversubscribed"
    res = p.corp("score", *p.small(run), *TINY["score"], "--executor", "ray", "--workers", cpus + 1)
    said = [ln for ln in res.stderr.splitlines() if "--executor ray:" in ln]
    ok = res.returncode == 0 and len(said) == 1 and f"this machine has {cpus}" in said[0]
    p.check("score", "--executor ray --workers CPUs+1 is one line before work", ok, res.stderr[-1500:])
    cmds = {q.pid: " ".join(q.info["cmdline"] or []) for q in psutil.process_iter(["cmdline"])}
    left = [pid for pid, c in cmds.items() if "corp-ray-" in c and not any(b in c for b in before)]  # its temp dir
    temp = {d.name for d in Path(tempfile.gettempdir()).glob("corp-ray-*")} - before
    p.check("score", "the Ray corp started leaves no process and no temp dir", not temp and not left, f"{temp} {left}")


def own_files_cases(p: Probe, recipe: Path) -> None:
    """Issue 57: corp never deletes or rewrites a file it did not write (inside an earlier corp model,
    in an --output-dir it did not make), and a message never says work was saved unless it was."""
    root = p.root

    # 11. a user's files inside a model an earlier `corp apply` wrote: one line naming one, all kept
    for flags in ([], ["--overwrite"]):
        out = root / f"earlier-model{len(flags)}"
        res = p.corp("apply", recipe, "--out", out)
        mine = {out / "user.txt": "mine\n", out / "sub" / "notes.md": "notes\n"}
        (out / "sub").mkdir(exist_ok=True)
        for path, text in mine.items():
            path.write_text(text)
        ok, why = p.one_line(p.corp("apply", recipe, "--out", out, *flags), "move it away")
        kept = res.returncode == 0 and all(path.is_file() and path.read_text() == text for path, text in mine.items())
        p.check(
            "apply",
            f"apply{''.join(' ' + f for f in flags)} into an earlier model keeps the user's files in it",
            ok and kept,
            why,
        )

    # 12. --output-dir on the user's own directory: one line before any work, their files as they were
    for m in ("score", "consolidate"):
        mine = root / f"userdir-{m}"
        mine.mkdir()
        (mine / "config.yaml").write_text("my: settings\n")
        (mine / "population.jsonl").write_text('{"key": "mine"}\n')
        before = {f: f.read_bytes() for f in mine.rglob("*") if f.is_file()}
        ok, why = p.one_line(p.corp(m, *p.small(mine), *TINY[m]), str(mine), "did not make")
        kept = {f: f.read_bytes() for f in mine.rglob("*") if f.is_file()} == before
        p.check(m, "--output-dir on a directory corp did not make: refused, nothing touched", ok and kept, why)
    run = root / "own-run"
    first = p.corp("score", *p.small(run), *TINY["score"])
    (run / "model").mkdir(exist_ok=True)
    (run / "model" / "notes.md").write_text("mine\n")
    before = {f: f.read_bytes() for f in run.rglob("*") if f.is_file()}
    res = p.corp("consolidate", *p.small(run), *TINY["consolidate"])
    ok, why = p.one_line(res, str(run / "model" / "notes.md"))
    untouched = first.returncode == 0 and {f: f.read_bytes() for f in run.rglob("*") if f.is_file()} == before
    p.check("consolidate", "a user file in RUN_DIR/model is refused before any work", ok and untouched, why)

    # 13. Ctrl-C in analyze-rank's analysis, no --output-dir: the line names where the rows are, and
    # the analysis of an existing run interrupted says that nothing was saved
    here = root / "ar-cwd"
    here.mkdir()
    small = [a for a in p.small(Path("unused")) if a not in ("--output-dir", Path("unused"))]
    res = p.corp("analyze-rank", *small, *TINY["analyze-rank"], fault="ctrl-c-analysis", cwd=here)
    said = [ln for ln in res.stderr.splitlines() if ln.startswith("interrupted")]
    made = sorted((here / "runs").glob("*")) if (here / "runs").is_dir() else []
    ok = res.returncode == 130 and len(said) == 1 and len(made) == 1 and (made[0] / "population.jsonl").is_file()
    ok = ok and f"saved in 'runs/{made[0].name}'" in said[0]
    p.check("analyze-rank", "Ctrl-C without --output-dir names the run its rows are saved in", ok, res.stderr)
    if made:
        res = p.corp("analyze-rank", "--from-run", made[0], "--splits", "1", "--ranks", "1", fault="ctrl-c-analysis")
        said = [ln for ln in res.stderr.splitlines() if ln.startswith("interrupted")]
        ok = res.returncode == 130 and len(said) == 1 and "saved nothing" in said[0] and " is saved" not in said[0]
        p.check("analyze-rank", "Ctrl-C in the analysis of --from-run says nothing was saved", ok, res.stderr)

    # 14. a full disk while apply writes the card: one line naming --out, no temporary file, no marked
    # model without its card (the earlier model kept as it was)
    for earlier in (False, True):
        out = root / f"card-full{int(earlier)}"
        if earlier:
            p.corp("apply", recipe, "--out", out)
        before = {f.name: f.read_bytes() for f in out.iterdir()} if out.is_dir() else None
        res = p.corp("apply", recipe, "--out", out, fault="card-full")
        ok, why = p.one_line(res, str(out), "No space left on device")
        ok = ok and "--output-dir" not in res.stderr and not list(root.glob(f".{out.name}.*"))
        after = {f.name: f.read_bytes() for f in out.iterdir()} if out.is_dir() else None
        ok = ok and after == before and not any(".tmp" in name for name in after or {})
        what = "keeps the earlier model" if earlier else "leaves no model"
        p.check("apply", f"a full disk while writing the card names --out and {what}", ok, why)


if __name__ == "__main__":
    sys.exit(main())
