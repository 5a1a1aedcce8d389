"""`arith`: procedural integer arithmetic, the CPU default task.

Options (`--task arith:digits=2,ops=+,terms=2`): operand digits, operators drawn from `ops`
(any of + - *), number of terms. The embedded 135M model answers two-digit additions right about
15% of the time, which leaves room to improve. Reward: 1 if the last number in the completion
equals the value. `extract=equation` reads the number right after the first `=` instead (none when
no number follows it; the last number when there is no `=`): a base model without a chat template
(Gemma 3 270M) continues the prompt with "\n\n79 + 12 = 91\n\n79 + 12 = ..." until its length runs
out, and its last number is an operand.
"""

from __future__ import annotations

import random
import re

from corp.errors import CorpError
from corp.evaluate.tasks.base import Example, Task, last_number

EXTRACTS = ("last", "equation")
_NUMBER_START = re.compile(r"\s*-?[\d,]*\.?\d*")  # the number (if any) that opens a text


class Arith(Task):
    name = "arith"
    description = "procedural integer arithmetic (options: digits=2, ops=+, terms=2, pool=4000, extract=last|equation)"
    max_new_tokens = 24

    def __init__(self, digits: int = 2, ops: str = "+", terms: int = 2, pool: int = 4000, extract: str = "last"):
        self.digits, self.ops, self.terms, self.pool_size = int(digits), str(ops), int(terms), int(pool)
        if extract not in EXTRACTS:
            raise CorpError(f"task arith: extract={extract} is unknown; choose one of {', '.join(EXTRACTS)}")
        self.extract_rule = extract
        if self.digits < 1 or self.terms < 2 or not self.ops or set(self.ops) - set("+-*"):
            raise CorpError(
                "task arith: need digits >= 1, terms >= 2, ops from "
                f"'+-*' (got digits={digits}, ops={ops}, terms={terms})"
            )

    def signature(self) -> dict:
        sig = {"name": self.name, "digits": self.digits, "ops": self.ops, "terms": self.terms, "pool": self.pool_size}
        # only when given: the default's signature (every earlier run's) stays as it was
        return sig if self.extract_rule == "last" else {**sig, "extract": self.extract_rule}

    def pools(self) -> dict[str, list[Example]]:
        rng = random.Random(f"arith|{self.digits}|{self.ops}|{self.terms}")
        lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
        seen, examples = set(), []
        attempts = 0
        while len(examples) < self.pool_size and attempts < self.pool_size * 50:
            attempts += 1
            nums = [rng.randint(lo, hi) for _ in range(self.terms)]
            ops = [rng.choice(self.ops) for _ in range(self.terms - 1)]
            expr = " ".join(str(nums[0]) if i == 0 else f"{ops[i - 1]} {nums[i]}" for i in range(self.terms))
            if expr in seen:
                continue
            seen.add(expr)
            value = eval(expr, {"__builtins__": {}})  # noqa: S307 - digits and + - * only, built above
            examples.append(
                Example(
                    id=f"arith-{len(examples)}",
                    prompt=f"What is {expr}? Answer with just the number.",
                    answer=str(value),
                    columns={"expression": expr},
                )
            )
        return {"train": examples}

    def extract(self, completion: str) -> str | None:
        _, equals, after = completion.partition("=")
        if self.extract_rule == "equation" and equals:  # "... = 91 ...": 91; "... =" with no number: none
            return last_number(_NUMBER_START.match(after).group(0))
        return last_number(completion)
