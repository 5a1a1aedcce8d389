"""The token prefix every row of a batch shares, computed once (the hf backend's `generate_rows`).

A chat template opens every prompt with the same tokens (SmolLM2's: a system message and the user
turn's opening; with arith's "What is ", 27 of the quick start's 46 prompt tokens). A left-padded
batch computes them once per row; here they are run once (batch 1), their key/value cache is repeated to the batch, and
`generate` is given prefix + padding + each row's suffix: it feeds only the uncached tokens, and its
position ids (the attention mask's cumulative sum) are each row's unpadded positions, so every row
sees what it saw left-padded. Only caches that hold every past token as a plain tensor qualify (full
attention, or sliding-window layers whose window the whole sequence fits in); any other model, and a
prefix too short to matter, takes the left-padded path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

MIN_PREFIX = 8  # shorter shared prefixes save less than the extra forward pass costs


def shared_length(seqs: Sequence[Sequence[int]], stop: Sequence[str] | None = None) -> int:
    """How many leading tokens of `seqs` to compute once: their longest common prefix, cut so every row
    keeps its last prompt token (fed with the rest: its logits give the first new token) and, with stop
    strings, as many tokens as the longest one has bytes (a stop string ending at a new token then never
    reaches back across the padding into the prefix). 0 when that leaves under MIN_PREFIX tokens or
    there is one row."""
    if len(seqs) < 2:
        return 0
    keep = max([1] + [len(s.encode()) for s in stop or ()])
    limit = min(len(s) for s in seqs) - keep
    first, n = seqs[0], 0
    while n < limit and all(s[n] == first[n] for s in seqs):
        n += 1
    return n if n >= MIN_PREFIX else 0


def _plain_cache(model, total: int) -> DynamicCache | None:
    """An empty cache of the kind `generate` builds for `model`, or None where repeating a prefix's
    cache is not known to be exact: encoder-decoders, a configured cache implementation, layers other
    than full attention, and sliding windows the `total` tokens of a row do not fit in."""
    gen_config = getattr(model, "generation_config", None)
    if model.config.is_encoder_decoder or getattr(gen_config, "cache_implementation", None) is not None:
        return None
    cache = DynamicCache(config=model.config)
    for layer in cache.layers:
        sliding = type(layer) is DynamicSlidingWindowLayer and total < layer.sliding_window
        if type(layer) is not DynamicLayer and not sliding:
            return None
    return cache


def prefix_cache(model, prefix: Sequence[int], rows: int, total: int) -> DynamicCache | None:
    """The key/value cache of `prefix` (run once, batch 1) repeated for `rows` rows, or None where the
    model's cache does not qualify (`_plain_cache`) or its forward did not fill the cache given (a model
    with a cache of its own). `total`: the longest row's tokens, prefix and new tokens included."""
    cache = _plain_cache(model, total)
    if cache is None:
        return None
    device = next(model.parameters()).device
    model(
        input_ids=torch.tensor([list(prefix)], dtype=torch.long, device=device), past_key_values=cache, use_cache=True
    )
    if cache.get_seq_length() != len(prefix):
        return None
    cache.batch_repeat_interleave(rows)
    return cache
