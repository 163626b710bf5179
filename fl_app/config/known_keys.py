"""Which override keys ``conf/`` knows, so that a misspelt one is named with its likely fix before Hydra composes.

Hydra answers an override of a key no config defines (``privacy.clip_nrom=1``) with "Could not override ... To
append to your config use +privacy.clip_nrom=1": advice that would add an unused key. :func:`check_override_keys`
refuses such a key first, with the closest known ones. A key is known when conf/config.yaml or any option of a config
group defines it (under the group's package, or at the top for ``# @package _global_`` options such as the
experiments); a key that only some options define is left to Hydra and the validator.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from fl_app.config.readers import ConfigError

_PACKAGE = "# @package "


def _dotted(tree: Mapping[str, Any], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for key, value in tree.items():
        path = f"{prefix}{key}"
        keys.add(path)
        if isinstance(value, Mapping):
            keys |= _dotted(value, f"{path}.")
    return keys


def _package(text: str, group: str) -> str:
    """Where an option of ``group`` puts its keys: its ``# @package`` line, else the group's own name."""
    for line in text.splitlines():
        if line.startswith(_PACKAGE):
            package = line[len(_PACKAGE) :].strip()
            return "" if package == "_global_" else f"{package}."
    return f"{group}."


@functools.lru_cache(maxsize=4)
def known_keys(conf_dir: Path) -> frozenset[str]:
    """Every dotted key that conf/config.yaml or an option of one of its groups defines; and the group names."""
    top = yaml.safe_load((conf_dir / "config.yaml").read_text()) or {}
    top.pop("defaults", None)
    keys = _dotted(top)
    for option in sorted(conf_dir.glob("*/*.yaml")):
        group = option.parent.name
        keys.add(group)
        text = option.read_text()
        tree = yaml.safe_load(text) or {}
        tree.pop("defaults", None)
        keys |= _dotted(tree, _package(text, group))
    return frozenset(keys)


def check_override_keys(overrides: Iterable[str], conf_dir: Path) -> None:
    """Raise ConfigError for the first plain override (``key=value``) whose key no config in ``conf_dir`` defines,
    naming the closest known keys. Appends and deletions (``+``, ``~``), Hydra's own keys and command-line flags
    are Hydra's to judge."""
    keys = known_keys(conf_dir)
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep or key.startswith(("+", "~", "-", "hydra.", "hydra/")) or "@" in key:
            continue
        if (conf_dir / key).is_dir():
            _check_choices(conf_dir / key, value)
            continue
        if key in keys:
            continue
        close = difflib.get_close_matches(key, sorted(keys), n=2, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise ConfigError(f"unknown setting {key} (in {override!r}): no config in conf/ defines it{hint}")


def _check_choices(group: Path, value: str) -> None:
    """Each option a group override names (``strategy=dp_fedavg``, or a sweep ``strategy=dp_fedavg,dp_fedsam``)
    is one of the group's files; sweep functions and interpolations are Hydra's."""
    if any(c in value for c in "()$'\"[]{}"):
        return
    options = sorted(path.stem for path in group.glob("*.yaml"))
    for choice in value.split(","):
        if choice.strip() not in options:
            raise ConfigError(f"unknown {group.name} {choice.strip()!r}: the options are {', '.join(options)}")
