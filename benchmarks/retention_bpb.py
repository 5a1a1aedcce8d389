"""Bits per byte of one model on the retention text (corp.evaluate.retention), with load and score times.

python benchmarks/retention_bpb.py [MODEL]      # default smollm2-135m; results/bench-cpu-3-tasks/retention-base-bpb.json
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
t0 = time.perf_counter()
import corp  # noqa: F401 - before torch (OpenMP settings)
import torch

from corp.evaluate.retention import bits_per_byte, retention_text
from corp.runtime.models import load_model

torch.set_num_threads(1)
model, tok, mid, path = load_model(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m", "cpu")
t1 = time.perf_counter()
text, info = retention_text()
out = bits_per_byte(model, tok, text)
t2 = time.perf_counter()
keep = ("bpb", "interval", "windows", "tokens", "bytes")
print(
    json.dumps(
        {
            "model": mid,
            "info": info,
            **{k: out[k] for k in keep},
            "score_seconds": out["seconds"],
            "load_seconds": t1 - t0,
            "total_seconds": t2 - t0,
        },
        indent=1,
    )
)
