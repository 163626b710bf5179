"""Argument checks of the f-DP calculator: each returns the value as a float or int, or raises ValueError naming
the parameter and its range.
"""

from __future__ import annotations

import math
import numbers
from typing import Any


def _positive(name: str, value: Any) -> float:
    """``value`` as a float that is finite and > 0, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a positive real number, got {value!r}")
    x = float(value)
    if not math.isfinite(x) or x <= 0.0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return x


def _at_least_one(name: str, value: Any) -> float:
    """``value`` as a float that is finite and ≥ 1 (m: clients averaged; need not be an integer, e.g. m = qM)."""
    x = _positive(name, value)
    if x < 1.0:
        raise ValueError(f"{name} must be >= 1, got {value!r}")
    return x


def _count(name: str, value: Any) -> int:
    """``value`` as an int ≥ 1 (integral floats such as 600.0 are accepted), else ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    integral = isinstance(value, numbers.Integral) or (
        isinstance(value, numbers.Real) and math.isfinite(float(value)) and float(value).is_integer()
    )
    if not integral or int(value) < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _nonnegative(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a non-negative real number, got {value!r}")
    x = float(value)
    if not math.isfinite(x) or x < 0.0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return x
