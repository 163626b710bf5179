"""Invalid values and how a value is read: :class:`ConfigError`, :func:`require` (one message that names the key
and the allowed range) and the typed readers every group's validation uses (``_number``, ``_integer``,
``_choice``, ``_boolean``, …, and ``_known_keys``, which refuses a key no field has).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any


class ConfigError(ValueError):
    """An invalid configuration value; the message names the key and what is allowed."""


def _fail(key: str, value: object, allowed: str) -> ConfigError:
    return ConfigError(f"invalid config value {key}={value!r}: allowed {allowed}")


def require(ok: bool, key: str, value: object, allowed: str) -> None:
    """Raise :class:`ConfigError` ``invalid config value key=value: allowed ...`` unless ``ok`` (a settings class's
    :meth:`~StrategyConfig.check` uses it, as every check here does)."""
    if not ok:
        raise _fail(key, value, allowed)


_require = require


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


def _number(section: Mapping[str, Any], key: str, prefix: str) -> float:
    value = section.get(key)
    _require(_finite(value), f"{prefix}.{key}", value, "a finite number")
    return float(value)  # type: ignore[arg-type]


def _integer(section: Mapping[str, Any], key: str, prefix: str, minimum: int) -> int:
    value = section.get(key)
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    _require(ok, f"{prefix}.{key}", value, f"an integer >= {minimum}")
    return int(value)  # type: ignore[arg-type]


def _optional_integer(section: Mapping[str, Any], key: str, prefix: str, minimum: int) -> int | None:
    return None if section.get(key) is None else _integer(section, key, prefix, minimum)


def _choice(section: Mapping[str, Any], key: str, prefix: str, options: Iterable[str]) -> str:
    value = section.get(key)
    opts = tuple(options)
    _require(value in opts, f"{prefix}.{key}" if prefix else key, value, "one of " + ", ".join(opts))
    return str(value)


def _boolean(section: Mapping[str, Any], key: str, prefix: str) -> bool:
    value = section.get(key)
    _require(isinstance(value, bool), f"{prefix}.{key}", value, "true or false")
    return bool(value)


def _known_keys(section: Mapping[str, Any], cls: type, prefix: str, extra: Iterable[str] = ()) -> None:
    allowed = {f.name for f in fields(cls)} | set(extra)
    unknown = sorted(set(section) - allowed)
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(
            f"unknown config key(s) {', '.join(where + k for k in unknown)}; known: {', '.join(sorted(allowed))}"
        )
