"""Run by tests/test_vllm_engines.py in a fresh interpreter, where the engine it starts is the
process's first (vLLM's lazy imports run then): does the caller of the engine start keep its locals?

    python -m tests.vllm_first_engine MODEL_DIR [--keep-tracebacks]

Prints one JSON line: `kept` (the caller's local outlived its call), `tracebacks` (how many module
level exceptions corp dropped the stacks of). `--keep-tracebacks` turns corp's fix off (the planted
case)."""

from __future__ import annotations

import gc
import json
import sys
import weakref

import corp.runtime.backends.vllm as vllm_backend


class Sentinel:
    """Stands for what a run function binds: its run context, model, optimizer."""


def caller(model_dir: str) -> weakref.ref:
    held = Sentinel()  # a local of the frame that starts the engine
    backend = vllm_backend.VLLMBackend.from_model_name(model_dir, enforce_eager=True)
    backend.close()
    return weakref.ref(held)


def main() -> None:
    model_dir, keep = sys.argv[1], "--keep-tracebacks" in sys.argv[2:]
    dropped = []
    if keep:
        vllm_backend.forget_import_tracebacks = lambda: 0
    else:
        real = vllm_backend.forget_import_tracebacks
        vllm_backend.forget_import_tracebacks = lambda: dropped.append(real()) or dropped[-1]
    ref = caller(model_dir)
    gc.collect()
    print(json.dumps({"kept": ref() is not None, "tracebacks": sum(dropped)}))


if __name__ == "__main__":
    main()
