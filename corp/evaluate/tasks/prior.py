"""A split's label prior: how much a model scores by answering one thing everywhere.

The second edition's `letters` task had 78% of its test answers '1' (issue 39): a method that
learned to say '1' more often gained without learning the task. `label_prior` reports, for a list
of examples, the most common gold answer, its share, the number of distinct answers, and the
accuracy of always giving that answer as scored by the task's own check (which may accept it on
more examples than share it as their gold string, e.g. countdown, where many expressions are
right). The accuracy's 95% interval is Wilson's (corp.algorithms.stats.wilson_interval).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from corp.algorithms.stats import wilson_interval
from corp.errors import CorpError
from corp.evaluate.tasks.base import Example, Task


def label_prior(task: Task, examples: Sequence[Example]) -> dict:
    """{'n', 'distinct', 'majority_answer', 'majority_share', 'majority_accuracy', 'interval'} of `examples`.

    Ties between equally common answers go to the one that sorts first, so the report is the same in
    every process."""
    if not examples:
        raise CorpError(f"task '{task.name}': a label prior needs at least one example, got none")
    counts = Counter(ex.answer for ex in examples)
    top = max(counts.values())
    answer = min(a for a, c in counts.items() if c == top)
    hits = sum(bool(task.check(answer, ex)) for ex in examples)
    n = len(examples)
    return {
        "n": n,
        "distinct": len(counts),
        "majority_answer": answer,
        "majority_share": top / n,
        "majority_accuracy": hits / n,
        "interval": list(wilson_interval(hits, n)),
    }
