"""Where the Gaussian noise of the round is added (``privacy.placement``; journal Eq. 11, docs/mechanisms.md, 4): a
choice of object, not a flag tested across the round.

Both give the released average the same law N(0, σ²C²/m²) over the fixed denominator m, the one the ledger
accounts (:func:`fl_app.privacy.mechanisms.gaussian_noise_std`):

- :class:`ServerPlacement` (default): the server adds N(0, σ²C²/m²) to the average and re-clips every reply to C
  (a cohort's sum to k·C): it trusts no client's clip.
- :class:`ClientPlacement` (needs fixed-size sampling): each client adds N(0, σ²C²/m) to its clipped update, and the
  server only tops the noise up for the clients that did not contribute
  (:func:`~fl_app.privacy.mechanisms.client_noise_topup_std`); the aggregator sees noised updates.
"""

from __future__ import annotations

from fl_app.privacy import mechanisms as mech


class ServerPlacement:
    name = "server"
    #: Whether clients add their share of the noise (sent in their instructions).
    clients_add_noise = False
    #: Whether the server clips every reply again (it can only when the replies carry no noise of their own).
    server_clips = True

    def server_noise_std(self, noise_multiplier: float, clip_norm: float, m: float, contributing: int) -> float:
        return mech.gaussian_noise_std(noise_multiplier, clip_norm, m, "server")


class ClientPlacement:
    name = "client"
    clients_add_noise = True
    server_clips = False

    def server_noise_std(self, noise_multiplier: float, clip_norm: float, m: float, contributing: int) -> float:
        return mech.client_noise_topup_std(noise_multiplier, clip_norm, m, contributing)


Placement = ServerPlacement | ClientPlacement


def placement(name: str) -> Placement:
    """The placement called ``name`` (``privacy.placement``: server | client)."""
    return ClientPlacement() if name == "client" else ServerPlacement()
