"""Which implementation runs: the optional C modules (`protocol._speedups`, `broker.store._records`,
`broker.store._fsync`, built by setup.py where a C compiler is found) or the pure-Python twins
they mirror. Setting RQ_PURE_PYTHON (to anything but an empty string) before rocketq is imported
runs the twins everywhere (a bug hunt, a comparison)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def load(name: str) -> ModuleType | None:
    """The optional C module `name` (e.g. "broker.store._records"), or None when it was not built
    or RQ_PURE_PYTHON is set."""
    if os.environ.get("RQ_PURE_PYTHON"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def speedups() -> ModuleType | None:
    """`protocol._speedups`, or None when it was not built or RQ_PURE_PYTHON is set."""
    return load("protocol._speedups")
