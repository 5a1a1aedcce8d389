"""`jsonl:PATH`: a custom task from a JSONL file, one object per line with `prompt` and `answer`
(other fields are passed to reward functions as columns). Pair it with `--reward module:function`.

Default extraction: the last number when the gold answers are numbers, else the completion's
last non-empty line; default check: equality after that normalisation.
"""

from __future__ import annotations

from pathlib import Path

from corp import CorpError
from corp.evaluate.tasks.base import Example, Task, last_number, normalize_number
from corp.runs import iter_lines_jsonl


class JsonlTask(Task):
    description = "custom task: jsonl:PATH with 'prompt' and 'answer' per line"
    max_new_tokens = 256

    def __init__(self, path: str):
        self.path = Path(path)
        self.name = f"jsonl:{self.path}"
        self._examples: list[Example] | None = None

    def signature(self) -> dict:
        return {"name": "jsonl", "path": str(self.path.resolve())}

    def _load(self) -> list[Example]:
        if self._examples is None:
            out = []
            for lineno, row in iter_lines_jsonl(self.path):
                if "prompt" not in row or "answer" not in row:
                    raise CorpError(f"'{self.path}' line {lineno}: needs fields 'prompt' and 'answer'")
                cols = {k: v for k, v in row.items() if k not in ("prompt", "answer", "id")}
                out.append(Example(id=str(row.get("id", f"line-{lineno}")), prompt=str(row["prompt"]), answer=str(row["answer"]), columns=cols))
            if not out:
                raise CorpError(f"'{self.path}' has no examples")
            self._numeric = all(normalize_number(e.answer) is not None for e in out)
            if self._numeric:
                out = [Example(e.id, e.prompt, normalize_number(e.answer), e.columns) for e in out]
            self._examples = out
        return self._examples

    def pools(self) -> dict[str, list[Example]]:
        return {"train": self._load()}

    def extract(self, completion: str) -> str | None:
        self._load()
        if self._numeric:
            return last_number(completion)
        lines = [ln.strip() for ln in completion.strip().splitlines() if ln.strip()]
        return lines[-1] if lines else None
