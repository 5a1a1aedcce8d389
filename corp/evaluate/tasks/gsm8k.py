"""`gsm8k`: grade-school math word problems (train pool for selection, official test for test).

Gold = the text after `####`. Extraction (docs/methods.md): strict = the number after `#### `;
flexible = the last number in the completion (default, since small models rarely write `####`).
Commas and `$` are stripped and answers compared numerically. Option: `--task gsm8k:mode=strict`.
"""

from __future__ import annotations

import re

from corp.errors import CorpError
from corp.evaluate.tasks.base import Example, Task, last_number, normalize_number
from corp.evaluate.tasks.data import data_file, data_signature, read_records

_STRICT = re.compile(r"####\s*(-?[\d,$.]+)")


def gold_answer(solution: str) -> str:
    if "####" not in solution:
        raise ValueError("no '####' in solution")
    n = normalize_number(solution.split("####")[-1].strip().split()[0])
    if n is None:
        raise ValueError("gold after '####' is not a number")
    return n


def extract_strict(completion: str) -> str | None:
    m = _STRICT.findall(completion)
    return normalize_number(m[-1]) if m else None


def extract_flexible(completion: str) -> str | None:
    return last_number(completion)


class GSM8K(Task):
    name = "gsm8k"
    description = "GSM8K word problems (options: mode=flexible|strict); needs data"
    max_new_tokens = 256
    prompt_suffix = "\nSolve the problem step by step, then give the final answer on the last line as '#### <number>'."

    def __init__(self, mode: str = "flexible", data_dir: str | None = None):
        if mode not in ("flexible", "strict"):
            raise CorpError(f"task gsm8k: mode must be 'flexible' or 'strict', got '{mode}'")
        self.mode, self.data_dir = mode, data_dir

    def signature(self) -> dict:
        return {"name": self.name, "mode": self.mode, **data_signature(self)}

    def _load(self, split: str) -> list[Example]:
        path = data_file(self.name, f"gsm8k/{split}.jsonl", self.data_dir)
        out = []
        for lineno, row in read_records(path):
            try:
                gold = gold_answer(row["answer"])
                question = row["question"]
            except (KeyError, ValueError, IndexError) as exc:
                raise CorpError(f"'{path}' line {lineno}: not a GSM8K record ({exc})") from None
            out.append(Example(id=f"gsm8k-{split}-{lineno}", prompt=question + self.prompt_suffix, answer=gold))
        return out

    def pools(self) -> dict[str, list[Example]]:
        return {"train": self._load("train"), "test": self._load("test")}

    def extract(self, completion: str) -> str | None:
        return extract_strict(completion) if self.mode == "strict" else extract_flexible(completion)

    def check(self, answer: str | None, example: Example) -> bool:
        if answer is None:
            return False
        try:
            return abs(float(answer) - float(example.answer)) < 1e-6
        except ValueError:
            return False
