"""Retention: what a method costs a model off its task (issue 39), the text half.

Bits per byte of a causal LM on a fixed held-out text: the text is tokenized once, cut into
windows of at most `window` tokens, each window scored after one start token (the tokenizer's BOS,
else its EOS) so every token of the text is predicted, and the summed negative log2-likelihood is
divided by the text's UTF-8 bytes (bytes, not tokens: models with other tokenizers compare). Each
window also gets the bytes it covers (from the tokenizer's character offsets, so the windows'
bytes add up to the whole text), so the interval resamples windows: a percentile bootstrap of
sum(bits) / sum(bytes) over windows (corp.algorithms.stats.ratio_bootstrap_ci), and of the change from a base
scored on the same windows.

The text: Jules and Michel Verne's "In the Year 2889" (1889), public domain, the Project Gutenberg
eBook #19362 as reasoning-gym (Apache-2.0) ships it, `reasoning_gym/data/in_the_year_2889.txt`.
Held out: corp's bench tasks of the third edition (arith and the chosen task) never show it; the
`reorder` task and some reasoning-gym tasks (letter_counting, word_sorting, ...) take sentences or
words from it, so retention measured after training on those is not off-task. What is scored:
the body between the Gutenberg header and footer, without the transcriber's credit and the
bracketed editorial note, `_italics_` marks removed, each paragraph's hard line breaks joined (a
paragraph per line, a blank line between): about 32,000 characters. Its sha256 is in every report.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from pathlib import Path

from corp.algorithms.stats import PerExample, compare_paired, ratio_bootstrap_ci, wilson_interval
from corp.errors import CorpError
from corp.evaluate.tasks import SplitSizes, get_task, make_splits
from corp.evaluate.tasks.reorder import default_text, strip_gutenberg
from corp.runtime.context import cached_eval
from corp.runtime.models import load_model, shown_datasets
from corp.runtime.runs import write_json

TEXT_SOURCE = "reasoning_gym/data/in_the_year_2889.txt"
TEXT_TITLE = 'Jules and Michel Verne, "In the Year 2889" (1889)'
TEXT_LICENSE = (
    "public domain (Project Gutenberg eBook #19362; the file ships with reasoning-gym, Apache-2.0, "
    "under the Project Gutenberg License)"
)
WINDOW = 512  # tokens per scored window (fewer when the model's context is shorter)


def text_path() -> Path:

    return default_text()


def clean_text(raw: str) -> str:
    """The scored text from the Gutenberg file (module docstring)."""

    text = strip_gutenberg(raw)
    text = re.sub(r"^\s*Produced by .*$", "", text, flags=re.MULTILINE)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"(?<!\w)_(.+?)_(?!\w)", r"\1", text, flags=re.DOTALL)
    text = re.sub(r"^\s*End of Project Gutenberg.*$", "", text, flags=re.MULTILINE)
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    return "\n\n".join(p for p in paragraphs if p) + "\n"


def retention_text(path: str | Path | None = None) -> tuple[str, dict]:
    """(the text, a description: source, title, license, characters, bytes, sha256)."""
    p = Path(path) if path is not None else text_path()
    try:
        text = clean_text(p.read_bytes().decode("utf-8-sig"))
    except (OSError, UnicodeDecodeError) as exc:
        raise CorpError(f"retention text '{p}' could not be read as UTF-8 ({type(exc).__name__}: {exc})") from None
    data = text.encode("utf-8")
    info = {
        "source": TEXT_SOURCE if path is None else str(p),
        "title": TEXT_TITLE if path is None else p.name,
        "license": TEXT_LICENSE if path is None else "as its file says",
        "characters": len(text),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    return text, info


def windows(tokenizer, text: str, window: int) -> list[tuple[list[int], int]]:
    """[(token ids, bytes covered)] of consecutive windows of at most `window` tokens; the bytes add
    up to len(text.encode())."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
    if not ids:
        raise CorpError("the retention text tokenizes to nothing")
    out = []
    for s in range(0, len(ids), window):
        e = min(s + window, len(ids))
        lo = 0 if s == 0 else offsets[s][0]
        hi = len(text) if e == len(ids) else offsets[e][0]
        out.append((ids[s:e], len(text[lo:hi].encode("utf-8"))))
    return out


def bits_per_byte(model, tokenizer, text: str, window: int = WINDOW, batch: int = 8) -> dict:
    """{'bpb', 'interval', 'windows', 'tokens', 'bytes', 'window_bits', 'window_bytes', 'seconds'} of `model` on `text`."""
    import torch

    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if start is None:
        raise CorpError("bits per byte needs a start token: the tokenizer has neither a BOS nor an EOS token")
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit:
        window = max(1, min(window, int(limit) - 1))
    chunks = windows(tokenizer, text, window)
    device = next(model.parameters()).device
    bits: list[float] = []
    t0 = time.perf_counter()
    with torch.no_grad():
        for b in range(0, len(chunks), batch):
            group = [ids for ids, _ in chunks[b : b + batch]]
            width = max(len(g) for g in group)
            # right padding: the pad positions come after every scored token, so causal attention never sees them
            inp = torch.full((len(group), width + 1), start, dtype=torch.long)
            mask = torch.zeros((len(group), width + 1), dtype=torch.long)
            for i, g in enumerate(group):
                inp[i, 1 : len(g) + 1] = torch.tensor(g, dtype=torch.long)
                mask[i, : len(g) + 1] = 1
            logits = model(input_ids=inp.to(device), attention_mask=mask.to(device)).logits.float()
            logp = torch.log_softmax(logits[:, :-1], dim=-1)
            target = inp[:, 1:].to(device)
            picked = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1).double()
            for i, g in enumerate(group):
                bits.append(float(-picked[i, : len(g)].sum()) / math.log(2))
    n_bytes = [nb for _, nb in chunks]
    total = sum(n_bytes)
    return {
        "bpb": sum(bits) / total,
        "interval": list(ratio_bootstrap_ci(bits, n_bytes)),
        "windows": len(chunks),
        "window_tokens": window,
        "tokens": sum(len(ids) for ids, _ in chunks),
        "bytes": total,
        "window_bits": bits,
        "window_bytes": n_bytes,
        "seconds": time.perf_counter() - t0,
    }


def bpb_change(model: dict, base: dict) -> dict:
    """The change in bits per byte from `base` on the same windows, with its paired bootstrap interval."""
    if model["window_bytes"] != base["window_bytes"]:
        raise CorpError(
            "bits per byte of the model and the base were measured on different windows (another tokenizer "
            "or window length); their change has no paired interval"
        )
    return {
        "delta": model["bpb"] - base["bpb"],
        "interval": list(ratio_bootstrap_ci(model["window_bits"], model["window_bytes"], base["window_bits"])),
    }


# ---------------------------------------------------------------- `corp eval --retention`


def _bpb_of(ctx, text: str) -> dict:
    """Bits per byte of the run's model: the backend's own in-process model when it has one (hf),
    else the model loaded with transformers beside it (vLLM keeps its weights in the engine)."""
    backend = ctx.backend
    if backend.supports("model"):
        backend.set_direction(None)
        return bits_per_byte(backend.model, backend.tokenizer, text)

    model, tokenizer, _, _ = load_model(ctx.cfg.model, ctx.cfg.device, ctx.cfg.dtype)
    return bits_per_byte(model, tokenizer, text)


def _task_scores(ctx, evals, specs: list[str], sizes=None) -> dict:
    """{spec: {'accuracy', 'interval', 'n', 'example_ids', 'correct', 'prompt_tokens', 'generated_tokens'}}:
    greedy accuracy on each task's test split (the run's own for --task; another task's test split of
    `sizes`, by default the first --n-test of its split seed; `corp bench` passes its own split sizes so
    the examples are that task's bench test examples)."""
    import dataclasses

    out = {}
    for spec in specs:
        if spec == ctx.cfg.task:
            sub = ctx
        else:
            task = get_task(spec, ctx.cfg.data)
            test = make_splits(task, sizes or SplitSizes(0, 0, 0, ctx.cfg.n_test), ctx.cfg.split_seed)["test"]
            sub = dataclasses.replace(ctx, task=task, splits={**ctx.splits, "test": test})
        row = cached_eval(sub, evals, "test", None)
        correct = [int(bool(c)) for c in row["correct"]]
        out[shown_datasets(spec)] = {  # a Python API dataset by its name, not its path in corp's cache
            "accuracy": sum(correct) / len(correct),
            "interval": list(wilson_interval(sum(correct), len(correct))),
            "n": len(correct),
            "example_ids": sub.example_ids("test"),
            "correct": correct,
            "prompt_tokens": int(row.get("prompt_tokens") or 0),
            "generated_tokens": int(row.get("generated_tokens") or 0),
        }
    return out


def score_retention(
    ctx, evals, retention_tasks: str = "", base: str | None = None, own_task: bool = True, sizes=None
) -> dict:
    """Retention of the run's model (and of `base`, with the change from it): writes and returns
    RUN_DIR/retention.json. `own_task=False` scores only `retention_tasks` (the bench has the own
    task's test outcomes already); `sizes` (a SplitSizes) places the other tasks' test splits."""
    import dataclasses

    others = [s.strip() for s in retention_tasks.split(";") if s.strip() and s.strip() != ctx.cfg.task]
    specs = ([ctx.cfg.task] if own_task else []) + others
    text, info = retention_text()
    report = {
        "format": 1,
        "text": {**info, "window_tokens": WINDOW},
        "models": {},
        "change": None,
        "split_seed": ctx.cfg.split_seed,
        "n_test": ctx.cfg.n_test,
    }
    contexts = [("model", ctx)]
    if base:
        base_cfg = dataclasses.replace(ctx.cfg, model=base)
        contexts.append(("base", dataclasses.replace(ctx, cfg=base_cfg, _backend=None, _weights_hash=None)))
    for label, c in contexts:
        report["models"][label] = {
            "model": c.cfg.model,
            "model_id": c.model_id,
            "weights_hash": c.weights_hash,
            "bpb": _bpb_of(c, text),
            "tasks": _task_scores(c, evals, specs, sizes),
        }
        if c is not ctx:
            c.close_built_backend()  # the base's engine, built for this; the run's own is its run's to close
    if base:
        mine, theirs = report["models"]["model"], report["models"]["base"]
        report["change"] = {
            "bpb": bpb_change(mine["bpb"], theirs["bpb"]),
            "tasks": {
                spec: compare_paired(
                    "model",
                    PerExample(mine["tasks"][spec]["correct"], mine["tasks"][spec]["example_ids"]),
                    "base",
                    PerExample(theirs["tasks"][spec]["correct"], theirs["tasks"][spec]["example_ids"]),
                )
                for spec in mine["tasks"]
            },
        }
    write_json(ctx.run_dir / "retention.json", report)
    return report


def retention_lines(report: dict) -> list[str]:
    """The retention report as table lines."""
    lines = [f"retention: bits per byte on {report['text']['title']} ({report['text']['bytes']} bytes)"]
    for label, m in report["models"].items():
        b = m["bpb"]
        lines.append(f"  {label:<6} {m['model']}: bpb {b['bpb']:.4f} [{b['interval'][0]:.4f}, {b['interval'][1]:.4f}]")
        for spec, t in m["tasks"].items():
            lines.append(
                f"  {label:<6} {spec}: accuracy {t['accuracy']:.3f} [{t['interval'][0]:.3f}, {t['interval'][1]:.3f}] "
                f"on {t['n']}"
            )
    change = report.get("change")
    if change:
        d = change["bpb"]
        lines.append(f"  change from base: bpb {d['delta']:+.4f} [{d['interval'][0]:+.4f}, {d['interval'][1]:+.4f}]")
        for spec, c in change["tasks"].items():
            lines.append(
                f"  change from base: {spec} {c['difference']:+.3f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]"
            )
    return lines
