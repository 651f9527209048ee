"""Which implementation runs: the optional C module `protocol._speedups` (built by setup.py where a
C compiler is found) or the pure-Python twins it mirrors. Setting RQ_PURE_PYTHON (to anything but
an empty string) before rocketq is imported runs the twins everywhere (a bug hunt, a comparison)."""

from __future__ import annotations

import os
from types import ModuleType


def speedups() -> ModuleType | None:
    """`protocol._speedups`, or None when it was not built or RQ_PURE_PYTHON is set."""
    if os.environ.get("RQ_PURE_PYTHON"):
        return None
    try:
        from protocol import _speedups  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _speedups  # type: ignore[no-any-return]
