"""`rg:NAME[:key=value,...]`: any dataset of reasoning-gym (procedurally generated, verifiable tasks;
`pip install 'corp[reasoning-gym]'`, pinned to 0.1.25).

- Data: `reasoning_gym.create_dataset(NAME, seed=seed, size=size, **options)`, with a fixed dataset
  seed (option `seed`, default 0) so the pool, and so every split drawn from it, is the same on
  every machine and in every process. Questions that repeat are kept once (the split contract
  needs disjoint splits); all four splits are drawn from this one pool, test first (as `arith`).
- Prompt: the gym's question followed by an instruction to answer inside `<answer>...</answer>`
  (the gym's "direct" system prompt by default, `instruction=default|direct|simple|none`); corp's
  backends send one user message, so the instruction goes into it rather than a system message.
- Answer extraction: the gym's own `reasoning_gym.utils.extract_answer` (the last
  `<answer>...</answer>`); no tags, no answer. `extract=fallback` (our departure, for small models
  that rarely write the tags): without tags, the last number when every gold answer of the pool is
  a number, else the last non-empty line. Reward: the dataset's own `score_answer(answer,
  entry)` (in [0, 1]; some datasets give partial credit); correct = score 1.
- Options: any field of the dataset's config (`corp tasks` lists the datasets; tuple fields take
  `a|b|c`), plus `seed`, `size` (pool size, default 1000), `instruction`, `extract`, and the generic
  `max_new_tokens` / `stop`. Default generation length 128 tokens.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Sequence

from corp.errors import CorpError
from corp.evaluate.tasks.base import GENERIC_OPTIONS, Example, Task, last_number, normalize_number, parse_options
from corp.extras import available, require

INSTRUCTIONS = {"none": ""}  # filled from the gym's SYSTEM_PROMPTS when it is imported


def _gym(feature: str):

    return require("reasoning-gym", feature)


def rg_datasets() -> dict[str, str]:
    """{dataset name: one-line description} of the installed reasoning-gym, {} when it is not installed."""

    if not available("reasoning-gym"):
        return {}
    _gym("listing reasoning-gym datasets")
    from reasoning_gym.factory import DATASETS

    out = {}
    for name, (cls, _cfg) in sorted(DATASETS.items()):
        doc = (cls.__doc__ or "").strip().splitlines()
        out[name] = doc[0].rstrip(".") if doc else "(no description)"
    return out


def _coerce_option(field: dataclasses.Field, value, dataset: str):
    """A `key=value` string to the type of the config field's default."""
    default = (
        field.default
        if field.default is not dataclasses.MISSING
        else (field.default_factory() if field.default_factory is not dataclasses.MISSING else None)
    )
    text = str(value)
    try:
        if isinstance(default, bool):
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError("expected true or false")
            return text.lower() in ("true", "1")
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
        if isinstance(default, (tuple, list)):
            return type(default)(text.split("|"))
    except ValueError as exc:
        raise CorpError(
            f"task rg:{dataset}: option {field.name}={text!r} is not a {type(default).__name__} ({exc})"
        ) from None
    return text if isinstance(default, str) else value


class ReasoningGymTask(Task):
    description = "reasoning-gym dataset (rg:NAME[:key=value,...]); its own scorer is the reward"
    max_new_tokens = 128

    @classmethod
    def from_spec(cls, spec: str, rest: str, data_dir: str | None = None) -> tuple[Task, dict]:
        dataset, _, opts = rest.partition(":")
        if not dataset:
            raise CorpError("task 'rg' needs a dataset name: --task rg:NAME (`corp tasks` lists them)")
        kwargs = parse_options(spec, opts)
        gen = {k: kwargs.pop(k) for k in GENERIC_OPTIONS if k in kwargs}
        return cls(dataset, **kwargs), gen

    def __init__(
        self,
        dataset: str,
        seed: int = 0,
        size: int = 1000,
        instruction: str = "direct",
        extract: str = "tags",
        **options,
    ):
        gym = _gym(f"--task rg:{dataset}")
        from reasoning_gym.factory import DATASETS
        from reasoning_gym.utils import SYSTEM_PROMPTS

        if dataset not in DATASETS:
            raise CorpError(f"reasoning-gym has no dataset '{dataset}'; `corp tasks` lists them")
        if instruction not in set(SYSTEM_PROMPTS) | {"none"}:
            raise CorpError(
                f"task rg:{dataset}: instruction must be one of "
                f"{', '.join(sorted(set(SYSTEM_PROMPTS) | {'none'}))}, got '{instruction}'"
            )
        if not (isinstance(seed, int) and isinstance(size, int) and size >= 1):
            raise CorpError(
                f"task rg:{dataset}: seed must be an integer and size an integer >= 1, got seed={seed!r}, size={size!r}"
            )
        if extract not in ("tags", "fallback"):
            raise CorpError(f"task rg:{dataset}: extract must be 'tags' (the gym's) or 'fallback', got '{extract}'")
        self.dataset, self.seed, self.size, self.instruction, self.extract_mode = (
            dataset,
            int(seed),
            int(size),
            instruction,
            extract,
        )
        self.name = f"rg:{dataset}"
        _, config_cls = DATASETS[dataset]
        fields = {f.name: f for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")}
        unknown = set(options) - set(fields)
        if unknown:
            raise CorpError(
                f"task rg:{dataset} has no option(s) {', '.join(sorted(unknown))}; its options: "
                f"{', '.join(sorted(fields)) or 'none'}, seed, size, instruction, extract, max_new_tokens, stop, "
                "heldout, dev, select"
            )
        self.options = {k: _coerce_option(fields[k], v, dataset) for k, v in sorted(options.items())}
        try:
            self._ds = gym.create_dataset(dataset, seed=self.seed, size=self.size, **self.options)
        except (ValueError, TypeError, AssertionError) as exc:
            raise CorpError(
                f"task rg:{dataset}: reasoning-gym refused the options {self.options} ({type(exc).__name__}: {exc})"
            ) from None
        self._prompt_suffix = "" if instruction == "none" else "\n\n" + SYSTEM_PROMPTS[instruction].strip()
        self._entries: dict[str, dict] = {}
        self._pool: list[Example] | None = None
        self._numeric: bool | None = None

    def signature(self) -> dict:
        return {
            "name": "rg",
            "dataset": self.dataset,
            "options": {k: list(v) if isinstance(v, tuple) else v for k, v in self.options.items()},
            "seed": self.seed,
            "size": self.size,
            "instruction": self.instruction,
            "extract": self.extract_mode,
            "reasoning_gym": importlib.metadata.version("reasoning-gym"),
        }

    def pools(self) -> dict[str, list[Example]]:
        if self._pool is None:
            seen, pool = set(), []
            for i in range(self.size):
                try:
                    entry = self._ds[i]
                except Exception as exc:  # a generator that fails for these options: say which
                    raise CorpError(
                        f"task rg:{self.dataset}: reasoning-gym failed to generate item {i} with options "
                        f"{self.options} ({type(exc).__name__}: {exc})"
                    ) from None
                question = entry["question"]
                if question in seen:
                    continue
                seen.add(question)
                ex_id = f"rg-{self.dataset}-{i}"
                self._entries[ex_id] = entry
                pool.append(
                    Example(id=ex_id, prompt=question + self._prompt_suffix, answer=str(entry["answer"]).strip())
                )
            self._pool = pool
        return {"train": self._pool}

    def extract(self, completion: str) -> str | None:
        from reasoning_gym.utils import extract_answer

        if not isinstance(completion, str):
            return None
        answer = extract_answer(completion)
        if answer is not None or self.extract_mode == "tags":
            return answer
        # fallback (small models rarely write the tags): the last number when the gold answer is
        # a number, else the last non-empty line
        if self._numeric is None:
            self._numeric = all(normalize_number(e.answer) is not None for e in self.pools()["train"])
        if self._numeric:
            return last_number(completion)
        lines = [ln.strip() for ln in completion.strip().splitlines() if ln.strip()]
        return lines[-1] if lines else None

    def _score(self, answer: str | None, example: Example) -> float:
        if example.id not in self._entries:
            self.pools()
        return float(self._ds.score_answer(answer, self._entries[example.id]))

    def check(self, answer: str | None, example: Example) -> bool:
        return answer is not None and self._score(answer, example) >= 1.0

    def reward(self, completions: list[str], examples: Sequence[Example]) -> list[float | None]:
        return [self._score(self.extract(c), ex) for c, ex in zip(completions, examples)]
