"""`math500`: the 500-problem MATH test subset (PRM800K split).

There is only one file, so all four splits are drawn disjointly from its 500 problems.
Extraction: the content of the last brace-matched `\\boxed{...}`; equivalence with math-verify.
"""

from __future__ import annotations

from corp.errors import CorpError
from corp.evaluate.tasks.base import Example, Task
from corp.evaluate.tasks.data import data_file, data_signature, read_records


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), braces matched."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def equivalent(answer: str, gold: str) -> bool:
    from math_verify import parse, verify

    try:
        g = parse(f"\\boxed{{{gold}}}")
        a = parse(f"\\boxed{{{answer}}}")
        return bool(verify(g, a))
    except Exception:
        return answer.replace(" ", "") == gold.replace(" ", "")


class Math500(Task):
    name = "math500"
    description = "MATH-500 competition math, boxed answers checked with math-verify; needs data"
    max_new_tokens = 512
    prompt_suffix = "\nPlease reason step by step, and put your final answer within \\boxed{}."

    def __init__(self, data_dir: str | None = None):
        self.data_dir = data_dir

    def signature(self) -> dict:
        return {"name": self.name, **data_signature(self)}

    def pools(self) -> dict[str, list[Example]]:
        path = data_file(self.name, "math500/test.jsonl", self.data_dir)
        out = []
        for lineno, row in read_records(path):
            try:
                out.append(
                    Example(
                        id=row["unique_id"],
                        prompt=row["problem"] + self.prompt_suffix,
                        answer=row["answer"],
                        columns={"level": row.get("level"), "subject": row.get("subject")},
                    )
                )
            except KeyError as exc:
                raise CorpError(f"'{path}' line {lineno}: not a MATH-500 record (missing {exc})") from None
        return {"train": out}

    def extract(self, completion: str) -> str | None:
        return last_boxed(completion)

    def check(self, answer: str | None, example: Example) -> bool:
        return answer is not None and equivalent(answer, example.answer)
