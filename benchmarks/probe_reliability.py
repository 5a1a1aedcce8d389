"""Probe issue 41's reliability cases through the real `corp` CLI, each in a fresh process, on a tiny
random Llama built here (seconds per case, no network, no embedded model); prints one PASS/FAIL line
per case and the counts, and exits 1 when any case fails.

Faults the CLI cannot be asked for (a full disk inside the tokenizers library, Ctrl-C at a given
moment) are planted by a `sitecustomize.py` on PYTHONPATH that a case switches on with
CORP_PROBE_FAULT; nothing in corp is changed.

    python benchmarks/probe_reliability.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import string
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SITECUSTOMIZE = """
import os
fault = os.environ.get("CORP_PROBE_FAULT")
if fault == "tokenizer-full":
    from transformers import PreTrainedTokenizerFast

    def _full(*a, **k):
        raise Exception("No space left on device (os error 28)")  # what the tokenizers library raises

    PreTrainedTokenizerFast.save_pretrained = _full
elif fault == "ctrl-c":
    import corp.consolidate as _c
    import corp.methods as _m

    def _interrupt(*a, **k):
        raise KeyboardInterrupt

    _c.apply_recipe = _interrupt
    _m.Method.__call__ = _interrupt
"""


def tiny_model(path: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<unk>"]
    chars = list(string.digits + string.ascii_letters + string.punctuation + " \n")
    tk = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(specials + chars)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.padding_side = "left"
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)


class Probe:
    def __init__(self, root: Path):
        self.root, self.results = root, []
        (root / "site").mkdir()
        (root / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self.model = root / "tiny"
        tiny_model(self.model)

    def corp(self, *args, fault: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
        env = {**os.environ, "CORP_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        env["PYTHONPATH"] = os.pathsep.join([str(self.root / "site"), str(REPO)])
        env.pop("CORP_PROBE_FAULT", None)
        if fault:
            env["CORP_PROBE_FAULT"] = fault
        return subprocess.run(
            [sys.executable, "-m", "corp.cli", *map(str, args)],
            capture_output=True,
            text=True,
            cwd=cwd or self.root,
            env=env,
            timeout=600,
        )

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.results.append(ok)
        print(f"{'PASS' if ok else 'FAIL'}  {name}" + ("" if ok else f"\n      {detail[-600:]}"), flush=True)

    def one_line(self, res, *fragments: str) -> tuple[bool, str]:
        errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error")]
        ok = res.returncode == 2 and len(errors) == 1 and "Traceback" not in res.stderr
        ok = ok and all(f in errors[0] for f in fragments)
        return ok, res.stderr

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
        ] + ["--n-test", "2", "--max-new-tokens", "2", "--run-dir", run_dir]


def es_args(p: Probe, run: Path, *extra) -> list:
    return ["es", *p.small(run), "--iterations", "1", "--population", "2", "--sigma", "0.05", *extra]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", help="work in this directory and keep it (default: a temporary one, removed)")
    args = ap.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="corp-probe-"))
    root.mkdir(parents=True, exist_ok=True)
    p = Probe(root)
    try:
        run(p)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    failed = p.results.count(False)
    print(f"\n{len(p.results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def run(p: Probe) -> None:
    root = p.root
    es_run = root / "es-run"
    res = p.corp(*es_args(p, es_run))
    assert res.returncode == 0, res.stderr[-2000:]
    recipe = es_run / "recipe.json"

    # 1. --overwrite replaces only corp's model directories
    for case in ("user-file", "copied-run-dir"):
        out = root / f"out-{case}"
        (out / "sub").mkdir(parents=True)
        named = out / "sub" / ("notes.txt" if case == "user-file" else "run_status.json")
        named.write_text("{}")
        res = p.corp("apply", recipe, "--out", out, "--overwrite")
        ok, why = p.one_line(res, str(named.parent if case != "user-file" else named))
        p.check(f"apply --overwrite refuses a {case} and deletes nothing", ok and named.exists(), why)

    # 2. a full disk in the tokenizers library: one line naming the path, the run marked failed
    res = p.corp("apply", recipe, "--out", root / "full", fault="tokenizer-full")
    ok, why = p.one_line(res, str(root / "full"), "No space left on device")
    p.check("apply: tokenizer 'os error 28' is one line naming --out", ok and not (root / "full").exists(), why)
    full_run = root / "es-full"
    res = p.corp(*es_args(p, full_run, "--report-to", "tensorboard"), fault="tokenizer-full")
    ok, why = p.one_line(res, str(full_run / "model"), "No space left on device")
    status = json.loads((full_run / "run_status.json").read_text()).get("status") if full_run.is_dir() else None
    p.check("es --report-to tensorboard: tokenizer full disk, run marked failed", ok and status == "failed", why)

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
    p.check("--allow-mismatch card states the mismatch up front", "--allow-mismatch" in head, res.stderr + head)

    # 5. silently wrong options
    cases = [
        (es_args(p, root / "x1", "--report-to", "tensorboard,tensorboard"), ("tensorboard twice",)),
        (["score", *p.small(root / "x2"), "--report-to", "tensorboard"], ("corp score", "--report-to")),
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
        p.check(f"refused in one line: {' '.join(map(str, argv[:1] + argv[-2:]))}", ok, why)

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
    p.check("a truncated cells/*.json is named with what to do", ok, why)
    for argv in (["apply", recipe, "--out", root / "ctrl-c"], ["self-consistency", *p.small(root / "sc")]):
        res = p.corp(*argv, fault="ctrl-c")
        said = [ln for ln in res.stderr.splitlines() if ln.startswith("interrupted")]
        ok = res.returncode == 130 and len(said) == 1 and "specialist" not in said[0]
        p.check(f"Ctrl-C in corp {argv[0]} says what fits it", ok, res.stderr)
    (root / "rw.py").write_text("def f(completions, **kw):\n    return [len(c) / 10 for c in completions]\n")
    score = ["score", *p.small(root / "rw-run"), "--population", "2", "--sigmas", "0.05"]
    first = p.corp(*score, "--reward", "rw.py:f")
    again = p.corp(*score, "--reward", f"{root}/rw.py:f")
    p.check(
        "rw.py:f and /abs/rw.py:f are one reward on resume",
        first.returncode == 0 and again.returncode == 0,
        first.stderr + again.stderr,
    )


if __name__ == "__main__":
    sys.exit(main())
