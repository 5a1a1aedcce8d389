"""Merge rules of CoRP stage 1, registered by name: each is one file with
`weights(rewards, gram, params) -> weights over the elites` and a `RULE` entry. A new rule is one
file here plus one line in MERGE_RULES; `--merge-rules` then searches and gates it beside the others.
"""

from corp.consolidate.merge_rules import pass1, pass2
from corp.consolidate.merge_rules.base import MergeParams, MergeRule

MERGE_RULES: dict[str, MergeRule] = {
    "pass1": pass1.RULE,
    "pass2": pass2.RULE,
}

__all__ = ["MERGE_RULES", "MergeParams", "MergeRule"]
