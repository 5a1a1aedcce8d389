"""`mbpp` and `humaneval`: write a Python function; reward 1 when all the problem's tests pass.

Every program runs in `corp.runtime.sandbox` (own namespaces, no network, a private root without
the data directory, the repository or home, wall/CPU/memory/process/file limits), and its tests
run in a separate tester process that the program cannot see or patch: values come back as plain
data and the tester compares them itself. `reward` runs all completions of a call in parallel
through `run_many`; `last_status_counts()` gives the pass/fail/timeout/crash/sandbox_error counts
of the most recent `reward` call for the population report, plus `isolation:<level>`: the number
of programs run at that isolation level (the first call also prints the level on stderr).

Where the machine gives no isolation (no root and no unprivileged user namespaces), the task
refuses to run model-written code: the task option `unsafe_no_isolation=1` (or the environment
variable CORP_UNSAFE_NO_ISOLATION=1) runs it anyway, with the user's own rights.

MBPP (Austin et al., 2021; full 974-problem file): official split, ids 1-10 few-shot (excluded),
11-510 test, 511-600 validation, 601-974 train. Pool 'train' = ids 511-974 (validation + train:
the generic split maker draws support / probe / validation from it), pool 'test' = ids 11-510.
The prompt gives the task text, the function name and the first test assert (the usual way of
showing the signature). The program is `code + test_setup_code`, the tests the three asserts:
the setup code runs in the program's process, after the code, because both problems that have
setup code (367 and 927) build trees from a `Node` class that the solution defines; the asserts
pass those trees back by name. `challenge_test_list` is not used (as in the standard evaluation).

HumanEval (Chen et al., 2021): 164 problems, test pool only ('train' is empty). The prompt is the
signature + docstring; the model is asked to write the full function. The program is the code;
the tester runs the prompt (its imports and helpers such as `poly`), then `test` and
`check(entry_point)` with `entry_point` taken from the program.

Extraction: the last ```python (or ```py) fenced block, else the last fenced block of any kind,
else an unterminated opening fence's content (a truncated generation), else the raw completion.

Departures from the usual harnesses, and why:
- HumanEval: if the extracted code lacks `def <entry_point>` (a model that continues the body, as
  base models do), the prompt is prepended, so both completion styles are scored; the prompt's
  import lines are always put before the code, so a full function that uses `List` without
  re-importing it is not failed for a missing import the prompt itself provided.
- `sys.exit(0)` before the asserts is a fail (the tests never got an answer), where the
  reference harness for HumanEval would count it as a pass.
- The tests run in their own process and see the program's return values as plain builtins: a
  return value of the program's own class (say, one whose `__eq__` is always True) is an opaque
  handle there and equals nothing; a function returning an iterator can still be iterated by the
  tests (`list(f(x))`). Where the reference harness runs tests and candidate in one interpreter.
  What the tests therefore cannot observe: changes a function makes to its arguments in place (they
  get a copy), and equality of objects that are not plain data. No canonical MBPP or HumanEval
  solution depends on either (all 974 + 164 pass).
- No per-problem "reliability guard" monkey-patching: the sandbox is the guard.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence

from corp.errors import CorpError
from corp.evaluate.tasks.base import Example, Task
from corp.evaluate.tasks.data import data_file, data_signature, read_records
from corp.runtime.sandbox import (
    STATUSES,
    UNSAFE_ENV,
    SandboxResult,
    Status,
    Tests,
    isolation_level,
    run_many,
    run_program,
    status_counts,
    unsafe_allowed,
)

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)```", re.DOTALL)
_OPEN_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n")


def extract_code(completion: str) -> str | None:
    """The code in a completion (see the module docstring); None when there is none."""
    if not isinstance(completion, str):
        return None
    blocks = _FENCE.findall(completion)
    code = None
    if blocks:
        py = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
        code = (py or [body for _, body in blocks])[-1]
    else:
        opens = list(_OPEN_FENCE.finditer(completion))
        if opens:  # an opening fence never closed: the generation was cut off inside the block
            code = completion[opens[-1].end() :]
        else:
            code = completion
    code = code.strip("\n")
    return code if code.strip() else None


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


class CodeTask(Task):
    """Shared sandbox plumbing: options, parallel reward, status counts."""

    max_new_tokens = 512

    def __init__(
        self,
        data_dir: str | None = None,
        timeout: float = 5.0,
        memory_mb: int = 1024,
        concurrency: int | None = None,
        unsafe_no_isolation: int = 0,
    ):
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise CorpError(f"task {self.name}: timeout must be a positive number of seconds, got {timeout!r}")
        if not (isinstance(memory_mb, int) and memory_mb >= 64):
            raise CorpError(f"task {self.name}: memory_mb must be an integer >= 64, got {memory_mb!r}")
        if concurrency is not None and not (isinstance(concurrency, int) and concurrency >= 1):
            raise CorpError(f"task {self.name}: concurrency must be an integer >= 1, got {concurrency!r}")
        if unsafe_no_isolation not in (0, 1, True, False):
            raise CorpError(f"task {self.name}: unsafe_no_isolation must be 0 or 1, got {unsafe_no_isolation!r}")
        self.data_dir, self.timeout, self.memory_mb, self.concurrency = data_dir, float(timeout), memory_mb, concurrency
        self.unsafe_no_isolation = bool(unsafe_no_isolation)
        self._isolation: dict | None = None
        self._last_counts: dict[str, int] = {s: 0 for s in STATUSES}
        self.last_results: list[SandboxResult | None] = []

    def signature(self) -> dict:
        return {"name": self.name, "timeout": self.timeout, "memory_mb": self.memory_mb, **data_signature(self)}

    def extract(self, completion: str) -> str | None:
        return extract_code(completion)

    def job(self, code: str, example: Example) -> tuple[str, Tests]:
        """The program run in the sandbox for extracted `code`, and the tests it is checked with."""
        raise NotImplementedError

    def isolation(self) -> dict:
        """The sandbox's isolation level here; refuses (CorpError) when there is none and the user
        did not accept that. Prints the level on stderr once per task."""
        if self._isolation is None:
            info = isolation_level()
            allowed = self.unsafe_no_isolation or unsafe_allowed()
            if not info["isolated"] and not allowed:
                raise CorpError(
                    f"task {self.name}: the code sandbox cannot isolate programs on this machine "
                    f"({info['why'] or info['level']}), so model-written code would run with your user's "
                    "rights. Enable unprivileged user namespaces (sysctl user.max_user_namespaces > 0; "
                    "kernel.unprivileged_userns_clone=1 where it exists) or run as root; to run it "
                    "anyway, accept the risk with the task option unsafe_no_isolation=1 (e.g. --task "
                    f"{self.name}:unsafe_no_isolation=1) or {UNSAFE_ENV}=1"
                )
            print(
                f"sandbox: task {self.name} runs programs at isolation level '{info['level']}'"
                + ("" if info["isolated"] else " (UNSAFE: no isolation, accepted by the user)"),
                file=sys.stderr,
            )
            self._isolation = info
        return self._isolation

    def _run_options(self) -> dict:
        return {"timeout": self.timeout, "memory_mb": self.memory_mb, "allow_unisolated": self.unsafe_no_isolation}

    def run(self, code: str | None, example: Example) -> SandboxResult | None:
        """Sandbox result for one extracted code (None when there is no code)."""
        if code is None:
            return None
        self.isolation()
        program, tests = self.job(code, example)
        return run_program(program, tests=tests, **self._run_options())

    def check(self, answer: str | None, example: Example) -> bool:
        result = self.run(answer, example)
        return result is not None and result.status is Status.PASS

    def reward(self, completions: list[str], examples: Sequence[Example]) -> list[float | None]:
        if len(completions) != len(examples):
            raise CorpError(f"task {self.name}: {len(completions)} completions for {len(examples)} examples")
        codes = [self.extract(c) for c in completions]
        todo = [i for i, c in enumerate(codes) if c is not None]
        level = self.isolation()["level"] if todo else None
        results = run_many(
            [self.job(codes[i], examples[i]) for i in todo], concurrency=self.concurrency, **self._run_options()
        )
        by_index: list[SandboxResult | None] = [None] * len(completions)
        for i, r in zip(todo, results):
            by_index[i] = r
        self.last_results = by_index
        counts = status_counts(results)
        counts["fail"] += len(completions) - len(todo)  # no code in the completion counts as a fail
        if todo:
            counts[f"isolation:{level}"] = len(todo)
        self._last_counts = counts
        return [1.0 if (r is not None and r.status is Status.PASS) else 0.0 for r in by_index]

    def last_status_counts(self) -> dict[str, int]:
        """pass / fail / timeout / crash / sandbox_error counts of the most recent `reward` call."""
        return dict(self._last_counts)


# ---------------------------------------------------------------- MBPP

# ids 1-10 are MBPP's few-shot prompts; corp does not use them
MBPP_TEST = range(11, 511)
MBPP_VALIDATION = range(511, 601)
MBPP_TRAIN = range(601, 975)


def mbpp_entry_point(code: str, tests: Sequence[str]) -> str:
    """The function the tests call: the first name called in the first test that the reference defines."""
    defined = re.findall(r"^\s*def\s+(\w+)\s*\(", code, re.MULTILINE)
    for name in re.findall(r"(\w+)\s*\(", tests[0] if tests else ""):
        if name in defined:
            return name
    if defined:
        return defined[-1]
    raise ValueError("no function definition in the reference code")


class MBPP(CodeTask):
    name = "mbpp"
    description = (
        "MBPP Python functions, run against the problem's asserts in a sandbox (options: timeout, memory_mb, "
        "concurrency, unsafe_no_isolation); needs data"
    )

    def _rows(self) -> list[dict]:
        path = data_file(self.name, "mbpp/mbpp.jsonl", self.data_dir)
        rows = []
        for lineno, row in read_records(path):
            try:
                tid, text, code, tests = int(row["task_id"]), row["text"], row["code"], list(row["test_list"])
                setup = row.get("test_setup_code") or ""
            except (KeyError, TypeError, ValueError) as exc:
                raise CorpError(f"'{path}' line {lineno}: not an MBPP record ({exc})") from None
            if not tests:
                raise CorpError(f"'{path}' line {lineno}: MBPP task {tid} has no tests")
            rows.append(
                {
                    "task_id": tid,
                    "text": text,
                    "code": code.replace("\r\n", "\n"),
                    "tests": tests,
                    "setup": setup.replace("\r\n", "\n"),
                }
            )
        return rows

    def make_example(self, row: dict) -> Example:
        entry = mbpp_entry_point(row["code"], row["tests"])
        prompt = (
            f"{row['text']}\n"
            f"Write a Python function named `{entry}`. Your code should pass this test:\n\n{row['tests'][0]}\n\n"
            "Give the complete function (with any imports it needs) in a ```python code block."
        )
        return Example(
            id=f"mbpp-{row['task_id']}",
            prompt=prompt,
            answer=row["code"],
            columns={
                "task_id": row["task_id"],
                "entry_point": entry,
                "test_setup_code": row["setup"],
                "test_list": row["tests"],
            },
        )

    def pools(self) -> dict[str, list[Example]]:
        train, test = [], []
        for row in self._rows():
            tid = row["task_id"]
            if tid in MBPP_TEST:
                test.append(self.make_example(row))
            elif tid in MBPP_VALIDATION or tid in MBPP_TRAIN:
                train.append(self.make_example(row))
        return {"train": train, "test": test}

    def job(self, code: str, example: Example) -> tuple[str, Tests]:
        tests = "\n".join(example.columns["test_list"]) + "\n"
        return code + "\n", Tests(
            tests, setup=example.columns.get("test_setup_code") or "", remote=(example.columns["entry_point"],)
        )


# ---------------------------------------------------------------- HumanEval

_IMPORT = re.compile(r"^(?:import\s+\S.*|from\s+\S+\s+import\s+.*)$", re.MULTILINE)


class HumanEval(CodeTask):
    name = "humaneval"
    description = (
        "HumanEval Python functions (164, test only), run against check() in a sandbox (options: timeout, memory_mb, "
        "concurrency, unsafe_no_isolation); needs data"
    )

    def pools(self) -> dict[str, list[Example]]:
        path = data_file(self.name, "humaneval/HumanEval.jsonl", self.data_dir)
        out = []
        for lineno, row in read_records(path):
            try:
                tid, prompt, entry, test, solution = (
                    row["task_id"],
                    row["prompt"],
                    row["entry_point"],
                    row["test"],
                    row["canonical_solution"],
                )
            except KeyError as exc:
                raise CorpError(f"'{path}' line {lineno}: not a HumanEval record (missing {exc})") from None
            user = (
                f"Complete the following Python function `{entry}`. Write the full function, signature included, "
                f"in a ```python code block.\n\n```python\n{prompt.rstrip()}\n```"
            )
            out.append(
                Example(
                    id=tid.replace("/", "-"),
                    prompt=user,
                    answer=prompt + solution,
                    columns={"task_id": tid, "entry_point": entry, "function_prompt": prompt, "test": test},
                )
            )
        return {"train": [], "test": out}

    def job(self, code: str, example: Example) -> tuple[str, Tests]:
        prompt, entry = example.columns["function_prompt"], example.columns["entry_point"]
        if not _defines(code, entry):
            code = prompt + code
        imports = "\n".join(_IMPORT.findall(prompt))
        return f"{imports}\n{code}\n", Tests(
            f"{example.columns['test']}\n\ncheck({entry})\n", prelude=prompt, remote=(entry,)
        )


__all__ = ["MBPP", "HumanEval", "extract_code", "mbpp_entry_point"]
