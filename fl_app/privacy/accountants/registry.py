"""Accountants by name, in the shape of Opacus' ``opacus/accountants/registry.py``: a dict from name to class,
:func:`create_accountant` and :func:`register_accountant`.

Every class is constructed as ``cls(config, **kwargs)`` with Flower's ``PrivacyConfig``:

- ``rdp``, ``prv``, ``pld``: :class:`~fl_app.privacy.accountants.sampled_gaussian.SampledGaussianAccountant` with
  that method (one subclass per method, so that a name maps to a class);
- ``gdp``: :class:`~fl_app.privacy.accountants.gdp.GDPAccountant` (``bound=`` and ``description=`` as keywords);
- ``flower-rdp``: Flower's own ``RdpAccountant`` (``orders=`` optional).

The built-in names are ``fl_app.core.choices.REGISTERED_ACCOUNTANTS``, the one list of them (the sampled Gaussian
ones are ``fl_app.core.choices.AccountantName``, the values of ``privacy.accountant``); this module checks on import
that it registers exactly those.
"""

from __future__ import annotations

from typing import Any

from flwr.supercore.privacy_accounting import PrivacyAccountant, PrivacyConfig
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

from fl_app.core.choices import ACCOUNTANTS as SAMPLED_GAUSSIAN_METHODS
from fl_app.core.choices import REGISTERED_ACCOUNTANTS
from fl_app.privacy.accountants.gdp import GDPAccountant
from fl_app.privacy.accountants.sampled_gaussian import SampledGaussianAccountant

__all__ = ["ACCOUNTANTS", "create_accountant", "register_accountant"]

#: Name → accountant class; :func:`register_accountant` adds to it.
ACCOUNTANTS: dict[str, type[Any]] = {
    **{method: SampledGaussianAccountant.with_method(method) for method in SAMPLED_GAUSSIAN_METHODS},  # type: ignore[arg-type]
    "gdp": GDPAccountant,
    "flower-rdp": RdpAccountant,
}

if tuple(ACCOUNTANTS) != REGISTERED_ACCOUNTANTS:
    raise ImportError(
        f"the registry's names {tuple(ACCOUNTANTS)} are not fl_app.core.choices' {REGISTERED_ACCOUNTANTS}"
    )

#: The members of Flower's PrivacyAccountant Protocol, which a registered class must have.
_MEMBERS = tuple(name for name in vars(PrivacyAccountant) if not name.startswith("_"))


def create_accountant(name: str, config: PrivacyConfig, **kwargs: Any) -> PrivacyAccountant:
    """A new accountant of the class registered as ``name``: ``ACCOUNTANTS[name](config, **kwargs)``.

    Raises:
        ValueError: no accountant is registered as ``name`` (the message lists the registered names).
    """
    try:
        cls = ACCOUNTANTS[name]
    except KeyError:
        raise ValueError(f"unknown accountant {name!r}; registered: {', '.join(ACCOUNTANTS)}") from None
    return cls(config, **kwargs)


def register_accountant(name: str, cls: type[Any], force: bool = False) -> None:
    """Register ``cls`` as ``name``, so that ``create_accountant(name, config, **kwargs)`` builds
    ``cls(config, **kwargs)``.

    ``cls`` must have the members of Flower's ``PrivacyAccountant`` Protocol (as class attributes: methods and
    properties); subclassing the Protocol is the simplest way.

    Raises:
        ValueError: ``name`` is already registered and ``force`` is False.
        TypeError: ``cls`` is not a class or lacks a member of the Protocol.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"an accountant's name must be a non-empty string, got {name!r}")
    if name in ACCOUNTANTS and not force:
        raise ValueError(
            f"an accountant is already registered as {name!r} ({ACCOUNTANTS[name].__name__}); force=True replaces it"
        )
    if not isinstance(cls, type):
        raise TypeError(f"register a class, not {cls!r}")
    missing = [member for member in _MEMBERS if not hasattr(cls, member)]
    if missing:
        raise TypeError(f"{cls.__name__} lacks {missing} of Flower's PrivacyAccountant interface")
    ACCOUNTANTS[name] = cls
