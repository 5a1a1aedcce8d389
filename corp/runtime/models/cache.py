"""Where corp keeps converted models (`cache_dir`, from corp.runtime.cachedir), and the marker and source files of a model directory corp wrote."""

from __future__ import annotations

from pathlib import Path

from corp.runtime.cachedir import cache_dir

DEFAULT_MODEL = "smollm2-135m"


def is_hf_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").exists()


# What _convert_gguf writes beside the weights; its "conversion" number says which conversion made it.
SOURCE_FILE = "corp_source.json"


CONVERSION = 2


# Every model directory corp writes carries a model card (corp.cards); a directory without one still loads.
CARD_FILE = "README.md"


def card_note(path: str | Path) -> str | None:
    """One line for a local model directory without a model card (None when it has one)."""
    p = Path(path)
    if p.is_dir() and not (p / CARD_FILE).is_file():
        return (
            f"model directory '{p}' has no model card ({CARD_FILE}): nothing records its base, training or "
            "license; corp uses it as a plain Hugging Face model"
        )
    return None


# Marks a directory corp wrote: only such directories are ever replaced (check_output_dir).
MARKER = "corp_model.json"


def is_corp_model(path: str | Path) -> bool:
    """Written by corp: the marker, or (before the marker existed) a GGUF conversion's source file."""
    return (Path(path) / MARKER).is_file() or (Path(path) / SOURCE_FILE).is_file()


def model_caches() -> list[Path]:
    """Directories that hold base models: corp's cache and the Hugging Face hub cache."""
    caches = [cache_dir()]
    try:
        from huggingface_hub import constants

        caches.append(Path(constants.HF_HUB_CACHE))
    except Exception:  # huggingface_hub missing or unusual: corp's own cache is still protected
        pass
    return caches
