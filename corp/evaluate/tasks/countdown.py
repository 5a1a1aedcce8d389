"""`countdown`: reach a target with given numbers, each used exactly once (+ - * / and parentheses).

Only solvable instances: each target is the value of an expression built from its numbers.
Verifier (docs/methods.md): the answer expression must use exactly the given numbers, each once, and
evaluate (exactly, with fractions) to the target. Options: `--task countdown:numbers=3,max=50`.
"""

from __future__ import annotations

import ast
import functools
import random
import re
from fractions import Fraction

from corp.errors import CorpError
from corp.evaluate.tasks.base import Example, Task

_ALLOWED = set("0123456789+-*/() .")


def _divide(a: Fraction, b: Fraction) -> Fraction:
    """Division, with a zero divisor refused the same way whatever the operands' types."""
    if b == 0:
        raise ZeroDivisionError
    return a / b


# the four operations an answer may use, by AST node type
_OPERATIONS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b, ast.Div: _divide}


def _evaluate_node(node, literals: list[int]) -> Fraction:
    """Exact value of an allowed AST node, appending the integer literals it reads (left to right)
    to `literals`; ValueError on any other node."""
    if isinstance(node, ast.Expression):
        return _evaluate_node(node.body, literals)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        literals.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, tuple(_OPERATIONS)):
        a, b = _evaluate_node(node.left, literals), _evaluate_node(node.right, literals)
        return _OPERATIONS[type(node.op)](a, b)
    raise ValueError("not allowed")


def evaluate_expression(expr: str) -> tuple[Fraction, list[int]] | None:
    """Exact value and the integer literals of an arithmetic expression; None if it is not one."""
    if not expr or set(expr) - _ALLOWED:
        return None
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return None
    literals: list[int] = []
    try:
        return _evaluate_node(tree, literals), literals
    except (ValueError, ZeroDivisionError, RecursionError):
        return None


def verify(expr: str | None, numbers: list[int], target: int) -> bool:
    if expr is None:
        return False
    result = evaluate_expression(expr)
    if result is None:
        return False
    value, literals = result
    return sorted(literals) == sorted(numbers) and value == target


@functools.lru_cache(maxsize=8)
def _pool(n_numbers: int, max_value: int, pool_size: int) -> tuple[Example, ...]:
    """The task's examples, a pure function of its options. Cached per process: a small space
    (numbers=2, max=20 has fewer distinct instances than the pool asks for) spins through all
    pool_size * 100 attempts, about 25 s, and retention scoring builds the task once per final model."""
    rng = random.Random(f"countdown|{n_numbers}|{max_value}")
    seen, examples = set(), []
    attempts = 0
    while len(examples) < pool_size and attempts < pool_size * 100:
        attempts += 1
        nums = [rng.randint(1, max_value) for _ in range(n_numbers)]
        order = nums[:]
        rng.shuffle(order)
        expr = str(order[0])
        for x in order[1:]:
            op = rng.choice("+-*/")
            expr = f"({expr} {op} {x})" if rng.random() < 0.5 else f"({x} {op} {expr})"
        res = evaluate_expression(expr)
        if res is None or res[0].denominator != 1 or res[0] <= 0:
            continue
        target = int(res[0])
        key = (tuple(sorted(nums)), target)
        if key in seen:
            continue
        seen.add(key)
        prompt = (
            f"Using the numbers {nums}, each exactly once, and the operations + - * / with parentheses, "
            f"write an expression that equals {target}. Put the expression alone on the last line after 'Answer:'."
        )
        examples.append(
            Example(
                id=f"countdown-{len(examples)}",
                prompt=prompt,
                answer=expr,
                columns={"numbers": nums, "target": target},
            )
        )
    return tuple(examples)


class Countdown(Task):
    name = "countdown"
    description = "reach the target with the given numbers, each once (options: numbers=3, max=50, pool=4000)"
    max_new_tokens = 96

    def __init__(self, numbers: int = 3, max: int = 50, pool: int = 4000):  # noqa: A002 - option name
        self.n_numbers, self.max_value, self.pool_size = int(numbers), int(max), int(pool)
        if self.n_numbers < 2 or self.max_value < 2:
            raise CorpError(f"task countdown: need numbers >= 2 and max >= 2 (got numbers={numbers}, max={max})")

    def signature(self) -> dict:
        return {"name": self.name, "numbers": self.n_numbers, "max": self.max_value, "pool": self.pool_size}

    def pools(self) -> dict[str, list[Example]]:
        return {"train": list(_pool(self.n_numbers, self.max_value, self.pool_size))}

    def extract(self, completion: str) -> str | None:
        m = re.findall(r"<answer>(.*?)</answer>", completion, flags=re.S)
        text = m[-1] if m else (completion.rsplit("Answer:", 1)[-1] if "Answer:" in completion else completion)
        candidates = re.findall(r"[\d\s+\-*/().]+", text)
        candidates = [c.strip().rstrip("=").strip() for c in candidates if re.search(r"\d", c)]
        for cand in reversed(candidates):
            if evaluate_expression(cand) is not None:
                return re.sub(r"\s+", "", cand)
        return None

    def check(self, answer: str | None, example: Example) -> bool:
        return verify(answer, example.columns["numbers"], example.columns["target"])
