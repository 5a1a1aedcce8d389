"""`jsonl:PATH`: a custom task from a data file, one record per line (or row) with a prompt and an
answer; other fields are passed to reward functions as columns. Pair it with `--reward`.

Formats, by extension: JSON Lines (any extension but the two below), `.csv` / `.tsv` (header row,
read with the csv module), `.parquet` (read with pyarrow when it is installed).

Options after a second colon, `jsonl:PATH:prompt=question,answer=solution,id=qid`: the field that
holds the prompt (default `prompt`), the answer (`answer`) and the example id (`id`, default
`line-N`), and `test=PATH2`: a second file of the same fields whose examples are the test pool (the
test split is drawn from it, the other splits from PATH; its default ids are `test-line-N`).
`max_new_tokens=N` and `stop=...` work as for every task (see `get_task`).

Default extraction: the last number when every gold answer is a number, else the completion's
last non-empty line; default check: equality after that normalisation.

Each prompt is one example: a row repeating an earlier prompt (or a test-file prompt) is dropped,
with one warning, so no prompt is in two splits.

The task is identified by its path(s) and the sha256 of the file's bytes, so rows scored on one
version of the file are never reused after the file changes.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from corp.errors import CorpError
from corp.evaluate.tasks.base import GENERIC_OPTIONS, Example, Task, last_number, normalize_number, path_and_options
from corp.evaluate.tasks.data import file_sha256, read_records
from corp.runtime.models import shown_datasets


class JsonlTask(Task):
    description = "custom task: jsonl:PATH[:prompt=FIELD,answer=FIELD,id=FIELD,test=PATH2] (.jsonl, .csv, .parquet)"
    max_new_tokens = 256

    # `id` shadows the builtin on purpose: it is the option's name
    def __init__(
        self,
        path: str,
        prompt: str = "prompt",
        answer: str = "answer",
        id: str = "id",  # noqa: A002
        test: str | None = None,
    ):
        self.path = Path(path)
        self.test_path = Path(test) if test else None
        # the splits' seed: a Python API dataset by its name (`dataset-<hash>`), not by where this
        # machine's cache is, so the same rows give the same splits on any machine
        self.name = shown_datasets(f"jsonl:{self.path}")
        self.fields = {"prompt": str(prompt), "answer": str(answer), "id": str(id)}
        self._pools: dict[str, list[Example]] | None = None
        for p in (self.path, self.test_path):
            if p is not None and not p.exists():
                raise CorpError(f"data file '{p}' does not exist")
            if p is not None and p.is_dir():
                raise CorpError(f"data file '{p}' is a directory; name a .jsonl, .csv or .parquet file")

    @classmethod
    def from_spec(cls, spec: str, rest: str, data_dir: str | None = None) -> tuple[Task, dict]:
        name = spec.partition(":")[0]
        if not rest:
            raise CorpError(f"task '{name}' needs a path: --task jsonl:PATH (.jsonl, .csv or .parquet)")
        path, kwargs = path_and_options(spec, rest)
        gen = {k: kwargs.pop(k) for k in GENERIC_OPTIONS if k in kwargs}
        unknown = set(kwargs) - {"prompt", "answer", "id", "test"}
        if unknown:
            raise CorpError(
                f"task jsonl has no option(s) {', '.join(sorted(unknown))}; options: "
                "prompt=FIELD, answer=FIELD, id=FIELD, test=PATH, max_new_tokens=N, stop=S, heldout=START, dev=N, select=M"
            )
        return cls(path, **{k: str(v) for k, v in kwargs.items()}), gen

    def signature(self) -> dict:
        sig = {"name": "jsonl", "path": str(self.path.resolve()), "sha256": file_sha256(self.path)}
        if self.fields != {"prompt": "prompt", "answer": "answer", "id": "id"}:
            sig["fields"] = dict(self.fields)
        if self.test_path is not None:  # only when given: signatures of one-file tasks stay as they were
            sig["test"] = {"path": str(self.test_path.resolve()), "sha256": file_sha256(self.test_path)}
        return sig

    def _field(self, path: Path, row: dict, role: str, lineno: int):
        key = self.fields[role]
        if key not in row:
            mapped = "" if key == role else f" (mapped from '{role}')"
            have = ", ".join(sorted(map(str, row))) or "none"
            raise CorpError(
                f"'{path}' line {lineno}: missing field '{key}'{mapped}; fields present: {have}. Map another "
                f"field with jsonl:{self.path}:{role}=FIELD"
            )
        value = row[key]
        if role == "prompt" and not (isinstance(value, str) and value.strip()):
            raise CorpError(
                f"'{path}' line {lineno}: field '{key}' must be a non-empty "
                f"string, got {type(value).__name__} {str(value)[:40]!r}"
            )
        if role == "answer" and (value is None or isinstance(value, (dict, list))):
            raise CorpError(
                f"'{path}' line {lineno}: field '{key}' must be a string or a number, got "
                f"{'null' if value is None else type(value).__name__}"
            )
        return value

    def _read(self, path: Path, default_id: str) -> list[Example]:
        out, seen = [], {}
        used = set(self.fields.values())
        for lineno, row in read_records(path):
            prompt = self._field(path, row, "prompt", lineno)
            answer = self._field(path, row, "answer", lineno)
            ex_id = str(row[self.fields["id"]]) if self.fields["id"] in row else default_id.format(lineno)
            if ex_id in seen:
                raise CorpError(
                    f"'{path}' line {lineno}: id '{ex_id}' already used on line {seen[ex_id]}; ids must be unique"
                )
            seen[ex_id] = lineno
            cols = {k: v for k, v in row.items() if k not in used and k not in ("prompt", "answer")}
            out.append(Example(id=ex_id, prompt=prompt, answer=str(answer).strip(), columns=cols))
        if not out:
            raise CorpError(f"'{path}' has no examples")
        return out

    def pools(self) -> dict[str, list[Example]]:
        if self._pools is None:
            pools = {"train": self._read(self.path, "line-{}")}
            if self.test_path is not None:
                pools["test"] = self._read(self.test_path, "test-line-{}")
            pools = self._without_repeats(pools)
            # numbers are compared as numbers when every gold answer (of both files) is one
            self._numeric = all(normalize_number(e.answer) is not None for p in pools.values() for e in p)
            if self._numeric:
                pools = {
                    k: [Example(e.id, e.prompt, normalize_number(e.answer), e.columns) for e in p]
                    for k, p in pools.items()
                }
            self._pools = pools
        return self._pools

    def _without_repeats(self, pools: dict[str, list[Example]]) -> dict[str, list[Example]]:
        """Each prompt once: a row whose prompt an earlier row (or, for the train file, the test file)
        already has is dropped, with one warning saying how many, so that no prompt can land in two
        splits (a repeat in support and test would score the test on a training example)."""
        seen: set[str] = set()
        dropped: list[str] = []
        out = {}
        for name in sorted(pools, key=lambda k: k != "test"):  # the test file's prompts first: they stay held out
            kept = []
            for e in pools[name]:
                key = e.prompt.strip()
                if key in seen:
                    dropped.append(e.id)
                else:
                    seen.add(key)
                    kept.append(e)
            out[name] = kept
        if dropped:
            shown = ", ".join(dropped[:3]) + (", ..." if len(dropped) > 3 else "")
            warnings.warn(
                f"{self.name}: {len(dropped)} row(s) repeat the prompt of an earlier row or of the test file and "
                f"were dropped ({shown}), so no prompt is in two splits; remove them from the data to silence this",
                stacklevel=2,
            )
        return {k: out[k] for k in pools}

    def data_name(self, pool: str) -> str:
        """The data file itself, as the user named it (a Python API dataset: `dataset-<hash>`)."""
        path = self.test_path if pool == "test" and self.test_path is not None else self.path
        return f"'{shown_datasets(str(path))}'"

    def graded(self) -> bool:
        return any(e.answer not in (None, "") for pool in self.pools().values() for e in pool)

    def extract(self, completion: str) -> str | None:
        self.pools()
        if self._numeric:
            return last_number(completion)
        lines = [ln.strip() for ln in completion.strip().splitlines() if ln.strip()]
        return lines[-1] if lines else None
