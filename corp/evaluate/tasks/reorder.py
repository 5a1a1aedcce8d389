"""`reorder[:PATH]`: story ordering, a stand-in for the ROCStories task of the RandOpt and CoRP papers.

ROCStories is not available offline, so the examples are five consecutive sentences of a
narrative text, shuffled and labelled A to E; the model answers with the labels in the original
order. Default text: Jules and Michel Verne's "In the Year 2889" (1889, public domain; the
Project Gutenberg eBook #19362 that reasoning-gym, Apache-2.0, ships as
`reasoning_gym/data/in_the_year_2889.txt`), so the default needs `pip install 'corp[reasoning-gym]'`.
`reorder:PATH` uses any plain-text UTF-8 file instead (a Project Gutenberg header and licence
footer are dropped when present).

Reward (as described for the papers' ROCStories code): 0.6 x the fraction of the five positions
right + 0.4 x the fraction of the four adjacent pairs of the story (sentence i, sentence i+1) that
the answer puts in the right relative order. Worked examples: all right 1.0; the order reversed
0.6 x 1/5 + 0 = 0.12; one adjacent swap (A B D C E for A B C D E) 0.6 x 3/5 + 0.4 x 3/4 = 0.66.
We did not have the papers' code offline; "adjacent pairs in the right order" is read as the
relative order of each consecutive pair of the original story (a departure if their code counts
pairs that are also adjacent in the answer). Accuracy: the whole order right. No answer (fewer
than five distinct labels) scores 0. Max 64 new tokens.

Splits: sentences are cut into blocks of `block` (20) consecutive sentences; every `test_every`-th
(3rd) block feeds the test pool, the others the selection pool, and windows never cross a block
edge, so no test sentence is ever shown during selection. Within a pool, windows start at every
sentence (stride 1), so neighbouring examples share sentences (each with its own shuffle).
A transcriber's credit, bracketed editorial notes and `_italics_` marks are removed; windows
holding a sentence of more than 80 words are skipped.
The prompt gives the instruction first, shows the format with a random order that is not the
answer, lists the sentences and ends with "Order:". Options: `seed` (the shuffles, default 0), `block`, `test_every`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from pathlib import Path

from corp.errors import CorpError
from corp.evaluate.tasks.base import Example, Task, path_and_options
from corp.evaluate.tasks.data import file_sha256
from corp.extras import require

LABELS = "ABCDE"
_ABBREV = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|St|Prof|Messrs|Mme|Mlle|vs|etc|i\.e|e\.g|No|Vol|Ch)\.|\b[A-Z]\.)$")
_SPLIT = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_COMPACT = re.compile(r"(?<![A-Za-z])([A-E]{5})(?![A-Za-z])")
_SINGLE = re.compile(r"(?<![A-Za-z])([A-E])(?![A-Za-z])")
_SEPARATOR = re.compile(r"^[\s,;.>\-()\[\]→]*$")


def default_text() -> Path:
    from importlib.resources import files

    require(
        "reasoning-gym",
        "--task reorder (its default text ships with reasoning-gym; or pass your own: --task reorder:PATH)",
    )
    return Path(str(files("reasoning_gym") / "data" / "in_the_year_2889.txt"))


def split_sentences(text: str) -> list[str]:
    """Plain-text sentence splitter: ., ! or ? followed by space and a capital, not after a common
    abbreviation or an initial. Paragraph and line breaks are whitespace."""
    flat = re.sub(r"\s+", " ", text).strip()
    pieces = _SPLIT.split(flat)
    out: list[str] = []
    for piece in pieces:
        if out and _ABBREV.search(out[-1]):
            out[-1] = f"{out[-1]} {piece}"
        else:
            out.append(piece)
    return [s.strip() for s in out if s.strip()]


def strip_gutenberg(text: str) -> str:
    start = re.search(r"\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG[^\n]*\n", text)
    end = re.search(r"\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG", text)
    if start and end and start.end() < end.start():
        return text[start.end() : end.start()]
    return text


def extract_order(completion: str) -> str | None:
    """The last run of five distinct labels A-E, written compactly ('CAEBD') or separated by
    spaces, commas or arrows ('C, A, E, B, D'); None when there is none."""
    if not isinstance(completion, str):
        return None
    best: tuple[int, str] | None = None
    for m in _COMPACT.finditer(completion):
        if len(set(m.group(1))) == 5:
            best = (m.end(), m.group(1))
    singles = list(_SINGLE.finditer(completion))
    for i in range(len(singles) - 4):
        run = singles[i : i + 5]
        letters = "".join(m.group(1) for m in run)
        if len(set(letters)) != 5:
            continue
        if all(_SEPARATOR.match(completion[a.end() : b.start()]) for a, b in zip(run, run[1:])):
            if best is None or run[-1].end() > best[0]:
                best = (run[-1].end(), letters)
    return best[1] if best else None


def order_reward(answer: str | None, gold: str) -> float:
    """0.6 x positions right / 5 + 0.4 x adjacent story pairs in the right relative order / 4."""
    if answer is None or len(answer) != len(gold) or set(answer) != set(gold):
        return 0.0
    positions = sum(a == g for a, g in zip(answer, gold)) / len(gold)
    where = {label: i for i, label in enumerate(answer)}
    pairs = sum(where[gold[i]] < where[gold[i + 1]] for i in range(len(gold) - 1)) / (len(gold) - 1)
    return 0.6 * positions + 0.4 * pairs


class Reorder(Task):
    name = "reorder"
    description = (
        "story ordering (ROCStories stand-in): 5 shuffled sentences A-E, answer the order; reorder[:PATH] (default "
        "text ships with reasoning-gym); options: seed, block=20, test_every=3"
    )
    max_new_tokens = 64

    def __init__(self, path: str | None = None, seed: int = 0, block: int = 20, test_every: int = 3):
        self.seed, self.block, self.test_every = int(seed), int(block), int(test_every)
        if self.block < 5 or self.test_every < 2:
            raise CorpError(
                f"task reorder: need block >= 5 and test_every >= 2 (got block={block}, test_every={test_every})"
            )
        self.path = Path(path) if path else default_text()
        if not self.path.exists():
            raise CorpError(f"task reorder: text file '{self.path}' does not exist")
        if self.path.is_dir():
            raise CorpError(f"task reorder: '{self.path}' is a directory; name a plain-text file")
        self._pools: dict[str, list[Example]] | None = None

    @classmethod
    def from_spec(cls, spec: str, rest: str, data_dir: str | None = None) -> tuple[Task, dict]:
        if rest and "=" not in rest.split(":", 1)[0]:  # reorder:PATH[:key=value,...]
            path, kwargs = path_and_options(spec, rest)
            kwargs["path"] = path
            return cls.from_options(spec, kwargs, data_dir)
        return super().from_spec(spec, rest, data_dir)

    def signature(self) -> dict:
        return {
            "name": self.name,
            "text_sha256": file_sha256(self.path),
            "seed": self.seed,
            "block": self.block,
            "test_every": self.test_every,
        }

    def _sentences(self) -> list[str]:
        raw = self.path.read_bytes()
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            raise CorpError(f"task reorder: '{self.path}' line {line} is not UTF-8 text; save it as UTF-8") from None
        text = strip_gutenberg(text)
        text = re.sub(r"^\s*Produced by .*$", "", text, flags=re.MULTILINE)  # transcriber credit, not story
        text = re.sub(r"\[[^\]]*\]", " ", text)  # editorial notes in brackets
        text = re.sub(r"(?<!\w)_(.+?)_(?!\w)", r"\1", text, flags=re.DOTALL)  # _italics_ markup
        return split_sentences(text)

    @staticmethod
    def _usable(sentence: str) -> bool:
        return len(sentence.split()) <= 80  # a runaway "sentence" (a list, a table) is no sentence to place

    def pools(self) -> dict[str, list[Example]]:
        if self._pools is None:
            sents = self._sentences()
            pools: dict[str, list[Example]] = {"train": [], "test": []}
            for b0 in range(0, len(sents) - 4, self.block):
                pool = "test" if (b0 // self.block) % self.test_every == self.test_every - 1 else "train"
                block = sents[b0 : b0 + self.block]
                for s in range(len(block) - 4):
                    window = block[s : s + 5]
                    if not all(self._usable(x) for x in window):
                        continue
                    start = b0 + s
                    rng = random.Random(f"reorder|{self.seed}|{start}")
                    perm = list(range(5))
                    while perm == sorted(perm):
                        rng.shuffle(perm)
                    shown = [window[i] for i in perm]  # label LABELS[j] shows sentence perm[j]
                    gold = "".join(LABELS[perm.index(k)] for k in range(5))
                    lines = "\n".join(f"{LABELS[j]}. {sent}" for j, sent in enumerate(shown))
                    # the format example is a random order other than the gold one, so copying it
                    # is worth what a random guess is worth
                    example = list(LABELS)
                    rng.shuffle(example)
                    while "".join(example) == gold:
                        rng.shuffle(example)
                    # instruction first and a closing "Order:" cue: with the instruction after the
                    # list, the embedded 135M model restated the sentences and ran out of tokens
                    # (4.7% of 64 test completions held an order, against 23% with this form)
                    prompt = (
                        "Put the five shuffled sentences of a story back "
                        "in their original order. Reply with only the five "
                        "letters in the right order, separated by spaces, like: "
                        f"{' '.join(example)}. Do not repeat the sentences.\n\n"
                        f"{lines}\n\nOrder:"
                    )
                    pools[pool].append(Example(id=f"reorder-{start}", prompt=prompt, answer=gold))
            if len(pools["train"]) < 1 or len(pools["test"]) < 1:
                raise CorpError(
                    f"task reorder: '{self.path}' gives {len(pools['train'])} selection and {len(pools['test'])} test "
                    f"examples; it needs a longer text (at least {self.block * self.test_every} usable sentences)"
                )
            self._pools = pools
        return self._pools

    def extract(self, completion: str) -> str | None:
        return extract_order(completion)

    def reward(self, completions: list[str], examples: Sequence[Example]) -> list[float | None]:
        return [order_reward(self.extract(c), ex.answer) for c, ex in zip(completions, examples)]
