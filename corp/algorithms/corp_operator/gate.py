"""The validation gate: a paired lower-confidence-bound test of candidate against base.

docs/methods.md (CoRP, step 6): per validation example j, d_j = score_cand_j - score_base_j; accept only
if mean(d) - z * sd(d) / sqrt(n) > 0 (z = 1 in the paper). sd is the sample standard deviation
(ddof = 1). The bound is one-sided at confidence Phi(z) under the normal approximation of the
paired mean: z = 1 is 84%, so a candidate with no real gain passes about one time in six (more
often when many candidates are tried); z = 1.645 is 95%. With fewer than MIN_VALIDATION examples
the normal approximation is not worth much, so callers warn; with n < 2 the gate cannot be
computed and rejects. Both sides must be scores of the same examples in the same order: pass their
example ids and the gate checks it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from corp.errors import CorpError

MIN_VALIDATION = 30  # below this the normal approximation of the paired mean is poor
MIN_PROBE = 16  # below this the step-size choice is mostly noise


def confidence_level(z: float) -> float:
    """Phi(z), the one-sided confidence level of a lower bound mean - z * se."""
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def z_words(z: float) -> str:
    """'z = 1, one-sided 84%': z with the confidence level it stands for."""
    return f"z = {z:g}, one-sided {100 * confidence_level(z):.0f}%"


@dataclass
class GateResult:
    accepted: bool
    n: int
    mean_diff: float
    sd_diff: float
    lcb: float
    z: float
    candidate_score: float
    base_score: float
    reason: str
    confidence: float = 0.0  # Phi(z): the one-sided level of the lower bound
    wins: int = 0  # examples where the candidate scored above the base (0/1 rewards: right where the base was wrong)
    losses: int = 0  # and below it: the reverse

    def to_dict(self) -> dict:
        return asdict(self)


def margin(gate: dict) -> dict:
    """What the report and the card say of a gate's decision (`gate`: a GateResult's to_dict, which may
    come from a run older than its win/loss counts): the decision, wins and losses out of n, the paired
    mean difference, its lower bound and z."""
    out = {
        "decision": "deployed the candidate" if gate["accepted"] else "kept the base",
        "kept_base": not gate["accepted"],
        "n": gate["n"],
        "mean_diff": gate["mean_diff"],
        "lcb": gate["lcb"],
        "gate_z": gate["z"],
    }
    if "wins" in gate:
        out.update(wins=gate["wins"], losses=gate["losses"])
    return out


def margin_line(gate: dict, split: str = "validation") -> str:
    """One sentence of `margin(gate)`: 'gate (validation): the candidate won 6 and lost 3 of 64 examples ...'."""
    m = margin(gate)
    counts = (
        f"the candidate won {m['wins']} and lost {m['losses']} of {m['n']} examples (won: scored above the base)"
        if "wins" in m
        else f"n = {m['n']}"
    )
    return (
        f"gate ({split}): {counts}; paired mean difference {m['mean_diff']:+.4f}, lower bound {m['lcb']:+.4f} "
        f"(gate_z = {m['gate_z']:g}): {m['decision']}"
    )


def kept_out_line(cand: dict) -> str:
    """What the candidate a gate kept out scored on test beside the base (report.json's `corp.candidate_test`)."""
    return (
        f"the candidate the gate kept out ('{cand['candidate']}') scored {cand['accuracy']:.3f} on test vs the "
        f"base's {cand['base_accuracy']:.3f} (measured for the report only; no choice used it)"
    )


def paired_gate(
    candidate: Sequence[float],
    base: Sequence[float],
    z: float = 1.0,
    *,
    candidate_ids: Sequence | None = None,
    base_ids: Sequence | None = None,
) -> GateResult:
    """Accept the candidate when its paired lower confidence bound over the base is > 0.

    `candidate_ids` / `base_ids`: the example ids each side was scored on; when both are given they
    must be equal, in the same order (else CorpError: the per-example differences would pair
    different examples)."""
    if len(candidate) != len(base):
        raise CorpError(
            f"the gate pairs scores per example, but the candidate has {len(candidate)} and the base {len(base)}"
        )
    if candidate_ids is not None and base_ids is not None:
        cand_ids, ref_ids = list(candidate_ids), list(base_ids)
        if len(cand_ids) != len(candidate) or len(ref_ids) != len(base):
            raise CorpError(
                f"the gate got {len(cand_ids)} and {len(ref_ids)} example ids for {len(candidate)} scores per side"
            )
        if cand_ids != ref_ids:
            first = next((j for j, (a, b) in enumerate(zip(cand_ids, ref_ids)) if a != b), None)
            raise CorpError(
                "the gate's candidate and base were scored on different examples (first difference at position "
                f"{first}: {cand_ids[first]!r} vs {ref_ids[first]!r}); re-evaluate both on the same split"
            )
    n = len(candidate)
    level = confidence_level(z)
    if n < 2:
        return GateResult(
            False,
            n,
            0.0,
            0.0,
            float("-inf"),
            z,
            0.0,
            0.0,
            f"validation split has {n} example(s); the gate needs at least 2",
            level,
        )
    d = [c - b for c, b in zip(candidate, base)]
    wins, losses = sum(x > 0 for x in d), sum(x < 0 for x in d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    lcb = mean - z * sd / math.sqrt(n)
    accepted = lcb > 0
    verdict = "accepted" if accepted else "rejected"
    cmp = ">" if accepted else "<="
    reason = (
        f"{verdict}: mean gain {mean:+.4f} - {z:g} * sd {sd:.4f} / "
        f"sqrt({n}) = {lcb:+.4f} {cmp} 0 ({z_words(z)} lower bound)"
    )
    return GateResult(accepted, n, mean, sd, lcb, z, sum(candidate) / n, sum(base) / n, reason, level, wins, losses)
