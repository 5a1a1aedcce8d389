"""corp's version, readable without loading the package's Python API (the saved models' provenance)."""

__version__ = "0.1.0"
