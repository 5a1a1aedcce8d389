"""corp.registry.Registry, the one pattern behind methods, tasks, GRPO losses and merge rules."""

import pytest

from corp.algorithms.corp_operator.merge_rules import MERGE_RULES
from corp.algorithms.grpo import LOSS_VARIANTS
from corp.errors import CorpError
from corp.evaluate.tasks import TASKS
from corp.methods import REGISTRY
from corp.registry import Registry


def test_register_forms_duplicates_and_the_unknown_name_line():
    reg = Registry("widget")

    @reg.register
    class A:
        name = "a"

    @reg.register("b")
    def b():
        return 2

    c = reg.register("c", 3)
    assert (reg.lookup("a"), reg.lookup("b")(), c, list(reg)) == (A, 2, 3, ["a", "b", "c"])
    with pytest.raises(CorpError, match="unique name"):
        reg.register("a", 4)
    with pytest.raises(CorpError, match="unique name"):
        reg.register("", 4)
    with pytest.raises(CorpError) as info:
        reg.lookup("z")
    assert str(info.value) == "unknown widget 'z'; known: a, b, c"
    custom = Registry("loss", unknown="--loss '{name}' is unknown; choose one of {known}")
    custom.register("x", 1)
    with pytest.raises(CorpError, match=r"^--loss 'y' is unknown; choose one of x$"):
        custom.lookup("y")


@pytest.mark.parametrize(
    "registry", [REGISTRY, TASKS, LOSS_VARIANTS, MERGE_RULES], ids=["methods", "tasks", "losses", "merge-rules"]
)
def test_every_registry_names_the_known_entries_for_an_unknown_one(registry):
    assert isinstance(registry, Registry) and len(registry) >= 2
    # a misspelt name: one line naming it and every name the user could have meant
    with pytest.raises(CorpError) as info:
        registry.lookup("nope")
    message = str(info.value)
    assert "nope" in message and "\n" not in message
    assert all(name in message for name in registry), message
