"""F-TIS: decentralised GRPO across heterogeneous models that share rollouts, with truncated
importance sampling. Paper: arXiv 2605.22537. RECONSTRUCTION: no public code exists; this follows
docs/methods.md ("F-TIS"), itself built from the abstract and secondary notes.

What a run does (`corp ftis`): K nodes, each with its own model (`--nodes a,b`; default two nodes of
`--model`), answer the same prompts each step (drawn from the support split by a seed all nodes
share, so prompts are never sent). Every node samples G completions per prompt and broadcasts them
with its per-token log-probabilities: token ids + float32 logprobs (8 bytes a token) to a node with
the same tokenizer, else the UTF-8 text + its float32 sequence log-probability. Node k then takes
one GRPO step on the mixed group of K x G completions per prompt:
- advantages are group-relative over all K x G completions (GRPO's (R - mean) / (std + 1e-4));
- per token, the clipped GRPO loss of an off-policy completion (another node's) is multiplied by
  the truncated importance weight w_t = min(pi_old(a_t) / mu(a_t), C), detached (C = --tis-cap);
  the node's own completions have w_t = 1 (mu = pi_old: they were sampled from these weights);
- filter: an off-policy completion is kept if its advantage is positive or its KL from the
  generator, summed over its tokens, is below gamma (--kl-filter); otherwise it is dropped (weight 0).

Choices of ours (the paper's are not public), each stated:
- KL(pi_old || mu) per completion is estimated from the generator's own sample as
  sum_t (r_t log r_t - r_t + 1), r_t = pi_old(a_t) / mu(a_t): non-negative per token and unbiased
  for KL(pi || mu) under samples from mu (E_mu[r - 1] = 0). Log-ratios are clamped to +-50 first
  (such a completion is far above any gamma anyway).
- Across tokenizers (`--no-retokenize` forbids it): the receiver re-tokenises the sender's text
  (appending its own EOS when the sender's completion ended with EOS) and, since the sender's
  per-token logprobs do not align with local tokens, defines mu per LOCAL token as the sender's
  reported sequence log-probability spread evenly: log mu_t = log mu(text) / T_local. The product
  of the per-token ratios is then exactly pi_old(text) / mu(text); per token it is an approximation.
- Built on corp grpo (corp.algorithms.grpo.trainer): FTISConfig extends GRPOConfig and a node is a
  GRPOTrainer (optimizer set-up, checkpoint, micro-batch step) whose per-token loss is F-TIS's.
  num_iterations = 1 (pi_old = the current weights, detached), no KL penalty to a reference, no
  LoRA, no loss variant (those GRPO options are refused, UNSUPPORTED): the policy-gradient part is
  exactly corp grpo's per-token loss, so with only on-policy completions the loss equals plain
  GRPO's (and TRL's; tests/test_ftis.py). --epsilon-high and --scale-rewards work as in corp grpo.
- The sender's logprobs come from one forward pass over its own completions after generation (the
  HF backend's generate does not return them; a vLLM sender would), counted as inference FLOPs.
- Comparison arm (on unless `--skip-grpo-baseline`): each node alone, from its own base weights, runs
  on-policy GRPO for the same number of steps on the same prompts with K x G completions of its own
  per prompt, i.e. the same number of local updates and the same number of trained sequences per
  update; its FLOPs differ (it generates all of them itself, F-TIS recomputes others' logprobs),
  and both ledgers are reported so the comparison at matched FLOPs can be read off.
- Compute: `method_flops` is every node's ledger summed (each at its own model's size: generation,
  the logprob forward, training on the mixed group), the cost of F-TIS's models; `corp bench`
  charges it to node 0's row (its bench adapter, METHOD below). A run resumed with more --max-steps continues
  from the per-node checkpoints (weights, AdamW state, ledgers, traffic) and equals one run for the
  larger count (tests/test_bench_ftis.py); a checkpoint past --max-steps is reported at its own step.

Files: config.py (FTISConfig and the GRPO options it refuses), node.py (the math, the rollouts nodes
exchange, a node), run.py (the arms, the command, the report); this file: the bench adapter and METHOD.
"""

from __future__ import annotations

from corp.algorithms.grpo.trainer import drawn_positions
from corp.errors import CorpError
from corp.method import ITERATIVE, SMALL, BenchAdapter, Method, opt, option_default
from corp.methods.ftis.config import NAME, FTISConfig
from corp.methods.ftis.run import run_ftis, summary
from corp.runtime.models import resolve_model


# In the bench, node 0 (the bench's model) learns beside the other nodes (e.g. Gemma 3 270M); one step = every
# node generates prompts_per_step * num_generations completions, computes their logprobs, and trains on
# the mixed group. The cell's FLOPs are every node's (`method_flops`, each at its own model's size);
# the row is node 0's model. Node 0 alone is evaluated on test, and the GRPO comparison arm (GRPO has
# its own cells) is not run: both would only feed F-TIS's own report.
def _n_nodes(o: dict) -> int:
    nodes = o.get("nodes", option_default(FTISConfig, "nodes"))
    names = [n for n in (nodes if isinstance(nodes, (list, tuple)) else str(nodes).split(",")) if str(n).strip()]
    return len(names) or int(opt(o, FTISConfig, "n_nodes"))


def _nodes_usable(cfg, splits: dict) -> None:
    """Before compute: node 0 is the bench's model (F-TIS's row is node 0's), and every node's model
    resolves (a partner that is not installed, e.g. gemma3-270m without `make gemma`, is one line
    here instead of a failure at the first F-TIS cell)."""
    names = cfg.node_models()
    if names[0] != cfg.model:
        raise CorpError(
            f"--nodes '{cfg.nodes}' starts with '{names[0]}', but the bench's model is '{cfg.model}' and F-TIS's "
            "row is node 0's model; put the bench's model first"
        )
    for k, name in enumerate(names):
        try:
            resolve_model(name)  # converts an embedded model once; later calls only find it
        except CorpError as exc:
            raise CorpError(f"node {k} ('{name}'): {exc}") from None


METHOD = Method(
    NAME,
    FTISConfig,
    run_ftis,
    "F-TIS (reconstruction): nodes with their own models share rollouts + logprobs; GRPO on the mixed group with "
    "truncated importance weights and a KL filter; vs on-policy GRPO per node.",
    smoke={**SMALL, "steps": 2, "prompts_per_step": 2, "num_generations": 2, "learning_rate": 1e-3},
    summary=summary,
    bench=BenchAdapter(
        ITERATIVE,
        rf"node0-{NAME}",
        flops=("method_flops",),
        equal_data=True,
        unit="steps",
        units_done="steps",
        # a lower bound at the bench model's size: every node generates its completions on a share of support
        unit_evals=lambda o: (
            _n_nodes(o)
            * float(opt(o, FTISConfig, "prompts_per_step"))
            * float(opt(o, FTISConfig, "num_generations"))
            / max(1.0, float(opt(o, FTISConfig, "n_support")))
        ),
        defaults={"skip_grpo_baseline": True, "eval_nodes": "0", "eval_every": 1_000_000_000},
        check=_nodes_usable,
        touched=lambda o, seed, units: (
            None
            if units is None
            else drawn_positions(
                "corp-ftis", seed, units, int(o.get("n_support") or 0), int(opt(o, FTISConfig, "prompts_per_step"))
            )
        ),
        regime={"units": 100},  # issue 39: at least 100 optimizer steps at the top budget, as GRPO
    ),
)

__all__ = ["METHOD", "FTISConfig", "run_ftis"]
