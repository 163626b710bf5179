"""The ``fault_injection`` section: partitions whose client misbehaves on purpose (chaos testing)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fl_app.config.readers import _known_keys, _require


@dataclass(frozen=True)
class FaultInjectionConfig:
    """Chaos testing: partitions whose client misbehaves on purpose (the server must cope; see docs/running.md)."""

    raise_partitions: tuple[int, ...] = ()
    nan_partitions: tuple[int, ...] = ()
    wrong_shape_partitions: tuple[int, ...] = ()
    huge_norm_partitions: tuple[int, ...] = ()

    def fault_of(self, partition_id: int) -> str:
        for kind in ("raise", "nan", "wrong_shape", "huge_norm"):
            if partition_id in getattr(self, f"{kind}_partitions"):
                return kind
        return ""


def _validate_faults(section: Mapping[str, Any], num_clients: int) -> FaultInjectionConfig:
    _known_keys(section, FaultInjectionConfig, "fault_injection")
    lists: dict[str, tuple[int, ...]] = {}
    for key, value in section.items():
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < num_clients for v in value
        )
        _require(ok, f"fault_injection.{key}", value, f"a list of partition ids in [0, {num_clients})")
        lists[key] = tuple(int(v) for v in value)
    return FaultInjectionConfig(**lists)
