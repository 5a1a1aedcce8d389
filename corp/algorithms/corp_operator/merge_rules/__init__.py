"""Merge rules of CoRP stage 1, registered by name: each is one file with
`weights(rewards, gram, params) -> weights over the elites` and a `RULE` entry. A new rule is one
file here plus one registry line below; `--merge-rules` then searches and gates it beside the others.
"""

from corp.algorithms.corp_operator.merge_rules import pass1, pass2
from corp.algorithms.corp_operator.merge_rules.base import MergeParams, MergeRule
from corp.registry import Registry

MERGE_RULES: Registry[MergeRule] = Registry(
    "merge rule", unknown="merge rule '{name}' is not registered; registered: {known}"
)
MERGE_RULES.register(pass1.RULE)
MERGE_RULES.register(pass2.RULE)

__all__ = ["MERGE_RULES", "MergeParams", "MergeRule"]
