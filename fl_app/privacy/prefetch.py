"""The server's round noise, drawn while the round's last replies are still on their way (issue 22: the critical path).

The Gaussian noise the server adds to a round's average (journal Eq. 11; SPEC §2) does not depend on what the clients
sent: only its std does (the placement's share, known once the replies are in), and N(0, s²) = s·N(0, 1). Drawing
the model's ~1.7M standard normals takes ~15 ms on one core, which the round otherwise spends after its last reply
while every worker waits for the next model. :class:`PrefetchedNormals` draws the standard normals of the round's
shapes from the round's own source on a background thread, started when the first reply is in (a worker is done, its
core free: strategies/run_loop.py); :meth:`PrefetchedNormals.normal` then returns ``loc + scale · z`` for each shape
in turn.

Same values, not just the same law: NumPy's ``Generator.normal(loc, scale, size)`` computes every draw as
``loc + scale · z`` over the same standard-normal stream, so with ``loc = 0`` (the only mean the mechanisms use) the
prefetched noise of a seeded run is bit for bit the noise drawn on demand (tests/privacy/test_prefetch.py), and the
OS CSPRNG's Box–Muller draws (:class:`~fl_app.privacy.mechanisms.SecureRandom`) are scaled the same way. Which source
(seeded stream or CSPRNG) is not decided here: the caller passes the round's source
(:func:`fl_app.privacy.mechanisms.random_source`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from fl_app.privacy.mechanisms import NormalSource

__all__ = ["PrefetchedNormals"]


class PrefetchedNormals:
    """A :class:`~fl_app.privacy.mechanisms.NormalSource` whose draws for ``shapes`` (in that order) are made ahead
    from ``source`` on a background thread. Asking for another shape than the next prefetched one is an error (the
    stream would be consumed out of order); asking beyond the prefetched shapes draws from ``source``, which
    continues its stream where the prefetch left it."""

    def __init__(self, source: NormalSource, shapes: Sequence[tuple[int, ...]]) -> None:
        self._source = source
        self._shapes = [tuple(int(d) for d in shape) for shape in shapes]
        self._draws: list[np.ndarray | None] = []
        self._error: BaseException | None = None
        self._next = 0
        self._thread = threading.Thread(target=self._draw, name="prefetch-noise", daemon=True)
        self._thread.start()

    def _draw(self) -> None:
        try:
            for shape in self._shapes:
                # NumPy releases the GIL while it fills the array: the server's main thread runs meanwhile.
                self._draws.append(self._source.normal(0.0, 1.0, shape))
        except BaseException as exc:  # re-raised to whoever asks for the noise
            self._error = exc

    def normal(self, loc: float, scale: float, size: tuple[int, ...]) -> np.ndarray:
        """``loc + scale · z`` with ``z`` the next prefetched standard normals of shape ``size``."""
        self._thread.join()
        if self._error is not None:
            raise RuntimeError("drawing the prefetched noise failed") from self._error
        if self._next >= len(self._shapes):
            return self._source.normal(loc, scale, size)
        if tuple(size) != self._shapes[self._next]:
            raise ValueError(f"noise prefetched for shape {self._shapes[self._next]}, asked for {tuple(size)}")
        z = self._draws[self._next]
        self._draws[self._next] = None  # each draw is used once
        self._next += 1
        assert z is not None
        return loc + scale * z
