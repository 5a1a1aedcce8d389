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

Several texts (`--retention-texts`, issue 55: retention "on several public-domain texts, 50,000 tokens or
more in all"): corp knows three, each cleaned the same way and cut to a fixed excerpt whose sha256 corp
pins (another edition of a file is refused, not scored), and any UTF-8 file by its path:
- `verne-2889`, the default, above;
- `bierce-devils-dictionary`: Ambrose Bierce, "The Devil's Dictionary" (1911), public domain, as Debian's
  `dict-devil` ships it (`devil.dict.dz`, the Internet Wiretap edition): from its first entry, ABASEMENT;
- `jargon-file`: the Jargon File 4.4.7 (2003, Eric S. Raymond, ed.), placed in the public domain by its
  editors, as Debian's `jargon-text` ships it (`jargon.txt.gz`): chapters 1-12, its prose before the
  glossary (89,811 characters).
The Devil's Dictionary is cut to its first 100,000 characters, back to a paragraph's end (98,858). The three
together are 56,148 tokens for SmolLM2's tokenizer and 52,208 for Qwen2.5's (the report gives the count for
the model scored). `make retention-texts` fetches both packages from
Debian's archive (`apt-get download`, no root) and keeps the two files in corp's cache. Each text is cut
into windows of its own; the pooled bits per byte is the sum of all windows' bits over all their bytes,
its interval a bootstrap over every window, and each text's own figure is reported beside it.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corp.algorithms.stats import PerExample, compare_paired, ratio_bootstrap_ci, wilson_interval
from corp.errors import CorpError
from corp.evaluate.tasks import SplitSizes, get_task, make_splits
from corp.evaluate.tasks.reorder import default_text, strip_gutenberg
from corp.runtime.cachedir import cache_dir
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
        "name": DEFAULT_TEXT if path is None else str(p),
        "source": TEXT_SOURCE if path is None else str(p),
        "title": TEXT_TITLE if path is None else p.name,
        "license": TEXT_LICENSE if path is None else "as its file says",
        "characters": len(text),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    return text, info


# ------------------------------------------------------------------ several texts (`--retention-texts`)

DEFAULT_TEXT = "verne-2889"
EXCERPT = 100_000  # characters of each longer text (module docstring)


def excerpt(text: str, chars: int) -> str:
    """The first `chars` characters of `text`, cut back to the end of its last whole paragraph."""
    if len(text) <= chars:
        return text
    cut = text.rfind("\n\n", 0, chars)
    return text[: cut + 1] if cut > 0 else text[:chars]


def _paragraphs(text: str) -> str:
    """Each paragraph's hard line breaks joined (a paragraph per line, a blank line between), `_italics_` unmarked."""
    text = re.sub(r"(?<!\w)_(.+?)_(?!\w)", r"\1", text, flags=re.DOTALL)
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    return "\n\n".join(p for p in paragraphs if p) + "\n"


def _from(marker: str, until: str | None = None) -> Callable[[str], str]:
    """A cleaner: the text from the first line that starts with `marker` (up to the next line that is
    `until`), paragraphs joined, the excerpt."""

    def clean(raw: str) -> str:
        at = re.search(rf"^{re.escape(marker)}", raw, flags=re.MULTILINE)
        if at is None:
            raise CorpError(f"retention text: no line starts with {marker!r}: not the edition corp knows")
        end = re.search(rf"^{re.escape(until)}\s*$", raw[at.end() :], flags=re.MULTILINE) if until else None
        return excerpt(_paragraphs(raw[at.start() : at.end() + end.start()] if end else raw[at.start() :]), EXCERPT)

    return clean


@dataclass(frozen=True)
class KnownText:
    """A public-domain text corp can score: where its file is, how it is cleaned, what its excerpt's sha256 is."""

    title: str
    license: str
    files: tuple[str, ...]  # candidates: under corp's cache (texts/...) first, then where a package installs it
    clean: Callable[[str], str]
    sha256: str  # of the cleaned excerpt, UTF-8: another edition of the file is refused
    get: str  # how to get the file, for the one-line error


TEXTS: dict[str, KnownText] = {
    "bierce-devils-dictionary": KnownText(
        'Ambrose Bierce, "The Devil\'s Dictionary" (1911), the first 100,000 characters from ABASEMENT',
        "public domain (copyright expired; the Internet Wiretap edition, 1993, as Debian's dict-devil ships it)",
        ("texts/devil.dict.dz", "/usr/share/dictd/devil.dict.dz"),
        _from("ABASEMENT, n."),
        "9eb2b7d64ab5ca3341d997e84f19caca273cf1c420689a83dd5a98b43190d997",
        "`make retention-texts` (Debian's dict-devil package, fetched with apt-get download), or `apt install dict-devil`",
    ),
    "jargon-file": KnownText(
        "The Jargon File 4.4.7 (2003), chapters 1-12 (its prose, before the glossary)",
        "public domain (so placed by its editors; as Debian's jargon-text ships it)",
        ("texts/jargon.txt.gz", "/usr/share/doc/jargon-text/jargon.txt.gz"),
        _from("Chapter\u00a01.\u00a0Hacker Slang and Hacker Culture", "Glossary"),  # no-break spaces, as in the file
        "72cb2fb02a4e60fd820e30381f7274c3ff0cc96e70a48108806cd8292705a87d",
        "`make retention-texts` (Debian's jargon-text package, fetched with apt-get download), or `apt install jargon-text`",
    ),
}
KNOWN = (DEFAULT_TEXT, *TEXTS)


def parse_texts(spec: str | list | tuple) -> list[str]:
    """`--retention-texts`: names of corp's texts or paths to UTF-8 files, comma-separated (or a list)."""
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if str(s).strip()]
    if not items:
        raise CorpError(f"--retention-texts names no text; corp's: {', '.join(KNOWN)}, or a path to a UTF-8 file")
    for item in items:
        if item not in KNOWN and not Path(item).is_file():
            raise CorpError(
                f"--retention-texts: {item!r} is neither one of corp's texts ({', '.join(KNOWN)}) nor a file"
            )
    if len(set(items)) < len(items):
        raise CorpError(f"--retention-texts names a text twice: {', '.join(items)}")
    return items


def _read(path: Path) -> str:
    data = gzip.decompress(path.read_bytes()) if path.suffix in (".gz", ".dz") else path.read_bytes()
    return data.decode("utf-8-sig")


def known_text(name: str) -> tuple[str, dict]:
    """One of corp's texts other than the default: (the excerpt, its description), its sha256 checked."""
    spec = TEXTS[name]
    found = [p for p in (cache_dir() / f if not f.startswith("/") else Path(f) for f in spec.files) if p.is_file()]
    if not found:
        raise CorpError(f"retention text {name!r} is not on this machine: {spec.get}")
    try:
        text = spec.clean(_read(found[0]))
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as exc:
        raise CorpError(
            f"retention text {name!r}: '{found[0]}' could not be read ({type(exc).__name__}: {exc})"
        ) from None
    data = text.encode("utf-8")
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec.sha256:
        raise CorpError(
            f"retention text {name!r} from '{found[0]}' is another edition (its excerpt's sha256 {digest[:12]}..., "
            f"corp's {spec.sha256[:12]}...): its bits per byte would not compare with other runs'; remove the file "
            f"and run {spec.get.split(' (')[0]} again"
        )
    info = {"name": name, "source": str(found[0]), "title": spec.title, "license": spec.license}
    return text, {**info, "characters": len(text), "bytes": len(data), "sha256": digest}


def texts_of(names: list[str]) -> list[tuple[str, dict]]:
    """[(text, description)] of `names` (parse_texts), in order."""
    return [
        retention_text() if n == DEFAULT_TEXT else known_text(n) if n in TEXTS else retention_text(n) for n in names
    ]


def titles(names: list[str], licenses: bool = False) -> str:
    """The texts' titles for a sentence (with their licenses), from corp's list, without reading them."""

    def one(n: str) -> tuple[str, str]:
        if n == DEFAULT_TEXT:
            return TEXT_TITLE, TEXT_LICENSE
        return (TEXTS[n].title, TEXTS[n].license) if n in TEXTS else (Path(n).name, "as its file says")

    parts = [f"{t} ({lic})" if licenses else t for t, lic in map(one, names)]
    return parts[0] if len(parts) == 1 else f"{len(parts)} texts pooled: " + "; ".join(parts)


def describe(infos: list[dict]) -> dict:
    """The set's description (the report's "text"): one text's own, or the texts' titles, licenses and
    summed sizes with one sha256 over their sha256s in order."""
    if len(infos) == 1:
        return dict(infos[0])
    return {
        "name": ",".join(i["name"] for i in infos),
        "source": "; ".join(i["source"] for i in infos),
        "title": f"{len(infos)} texts: " + "; ".join(i["title"] for i in infos),
        "license": "; ".join(i["license"] for i in infos),
        "characters": sum(i["characters"] for i in infos),
        "bytes": sum(i["bytes"] for i in infos),
        "sha256": hashlib.sha256(",".join(i["sha256"] for i in infos).encode()).hexdigest(),
    }


def pooled(parts: list[dict]) -> dict:
    """bits_per_byte over several texts: every window of every text, the interval a bootstrap over all of them."""
    if len(parts) == 1:
        return parts[0]
    bits = [b for p in parts for b in p["window_bits"]]
    n_bytes = [n for p in parts for n in p["window_bytes"]]
    return {
        "bpb": sum(bits) / sum(n_bytes),
        "interval": list(ratio_bootstrap_ci(bits, n_bytes)),
        "windows": len(bits),
        "window_tokens": parts[0]["window_tokens"],
        "tokens": sum(p["tokens"] for p in parts),
        "bytes": sum(n_bytes),
        "window_bits": bits,
        "window_bytes": n_bytes,
        "seconds": sum(p["seconds"] for p in parts),
    }


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


def _bpb_of(ctx, texts: list[str]) -> list[dict]:
    """Bits per byte of the run's model on each text: the backend's own in-process model when it has one
    (hf), else the model loaded with transformers beside it (vLLM keeps its weights in the engine)."""
    backend = ctx.backend
    if backend.supports("model"):
        backend.set_direction(None)
        return [bits_per_byte(backend.model, backend.tokenizer, t) for t in texts]

    model, tokenizer, _, _ = load_model(ctx.cfg.model, ctx.cfg.device, ctx.cfg.dtype)
    return [bits_per_byte(model, tokenizer, t) for t in texts]


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
    ctx,
    evals,
    retention_tasks: str = "",
    base: str | None = None,
    own_task: bool = True,
    sizes=None,
    texts: str | list = DEFAULT_TEXT,
) -> dict:
    """Retention of the run's model (and of `base`, with the change from it): writes and returns
    RUN_DIR/retention.json. `own_task=False` scores only `retention_tasks` (the bench has the own
    task's test outcomes already); `sizes` (a SplitSizes) places the other tasks' test splits; `texts`
    (parse_texts) the texts bits per byte is pooled over, each also reported on its own."""
    import dataclasses

    others = [s.strip() for s in retention_tasks.split(";") if s.strip() and s.strip() != ctx.cfg.task]
    specs = ([ctx.cfg.task] if own_task else []) + others
    scored = texts_of(parse_texts(texts))  # every text read and checked before any model is scored
    infos = [info for _, info in scored]
    report = {
        "format": 2,  # 2: "texts", and "bpb_by_text" per model and in the change
        "text": {**describe(infos), "window_tokens": WINDOW},
        "texts": infos,
        "models": {},
        "change": None,
        "split_seed": ctx.cfg.split_seed,
        "n_test": ctx.cfg.n_test,
    }
    parts_of = {}
    contexts = [("model", ctx)]
    if base:
        base_cfg = dataclasses.replace(ctx.cfg, model=base)
        contexts.append(("base", dataclasses.replace(ctx, cfg=base_cfg, _backend=None, _weights_hash=None)))
    keep = ("bpb", "interval", "windows", "tokens", "bytes")
    for label, c in contexts:
        parts_of[label] = _bpb_of(c, [text for text, _ in scored])
        report["models"][label] = {
            "model": c.cfg.model,
            "model_id": c.model_id,
            "weights_hash": c.weights_hash,
            "bpb": pooled(parts_of[label]),
            "bpb_by_text": {i["name"]: {k: p[k] for k in keep} for i, p in zip(infos, parts_of[label])},
            "tasks": _task_scores(c, evals, specs, sizes),
        }
        if c is not ctx:
            c.close_built_backend()  # the base's engine, built for this; the run's own is its run's to close
    if base:
        mine, theirs = report["models"]["model"], report["models"]["base"]
        report["change"] = {
            "bpb": bpb_change(mine["bpb"], theirs["bpb"]),
            "bpb_by_text": {i["name"]: bpb_change(m, b) for i, m, b in zip(infos, parts_of["model"], parts_of["base"])},
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
    several = len(report.get("texts") or []) > 1
    for label, m in report["models"].items():
        b = m["bpb"]
        lines.append(f"  {label:<6} {m['model']}: bpb {b['bpb']:.4f} [{b['interval'][0]:.4f}, {b['interval'][1]:.4f}]")
        for name, t in (m.get("bpb_by_text") or {}).items() if several else ():
            lines.append(f"  {label:<6}   {name}: bpb {t['bpb']:.4f} [{t['interval'][0]:.4f}, {t['interval'][1]:.4f}]")
        for spec, t in m["tasks"].items():
            lines.append(
                f"  {label:<6} {spec}: accuracy {t['accuracy']:.3f} [{t['interval'][0]:.3f}, {t['interval'][1]:.3f}] "
                f"on {t['n']}"
            )
    change = report.get("change")
    if change:
        d = change["bpb"]
        lines.append(f"  change from base: bpb {d['delta']:+.4f} [{d['interval'][0]:+.4f}, {d['interval'][1]:+.4f}]")
        for name, t in (change.get("bpb_by_text") or {}).items() if several else ():
            lines.append(
                f"  change from base:   {name}: {t['delta']:+.4f} [{t['interval'][0]:+.4f}, {t['interval'][1]:+.4f}]"
            )
        for spec, c in change["tasks"].items():
            lines.append(
                f"  change from base: {spec} {c['difference']:+.3f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]"
            )
    return lines
