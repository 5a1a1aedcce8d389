"""A reward that moves with any change in a completion, for benchmarks/loop_check.sh: on the embedded
model at these sizes the task's own reward is 0 for every specialist and every GRPO sample, so ES
would never move its centre and GRPO's advantages would be 0, and the check would compare the base
with itself. The share of digits among a completion's first 24 characters differs between
specialists and between samples, so every method's weights change and a difference would show."""


def digit_share(completion: str) -> float:
    head = completion[:24]
    return sum(ch.isdigit() for ch in head) / 24
