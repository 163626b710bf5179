"""The server's round noise, drawn while the round's last replies are still on their way (off the critical path).

The Gaussian noise the server adds to a round's average (journal Eq. 11; docs/mechanisms.md, 4) does not depend on what
the clients sent: only its std does (the placement's share, known once the replies are in), and N(0, s²) = s·N(0, 1).
Drawing the model's ~1.7M standard normals takes ~15 ms on one core, which the round otherwise spends after its last
reply while every worker waits for the next model. :class:`PrefetchedNormals` draws as many standard normals as the
round's shapes hold from the round's own source on a background thread, started when the first reply is in (a worker is
done, its core free: strategies/run_loop.py); :meth:`PrefetchedNormals.normal` then returns ``loc + scale · z`` with the
next of them, in stream order.

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
    """A :class:`~fl_app.privacy.mechanisms.NormalSource` whose first standard normals, as many as ``shapes`` hold,
    are drawn ahead from ``source`` on a background thread, as one flat run of the stream. Draws of any shapes
    then take the next values of that run in order, and draws past its end continue from ``source``: a seeded
    stream gives exactly the values it gives on demand (its draws are one sequence, whatever the shapes asked
    for), so a mechanism that asks for other shapes than the average's (a test's weakened one) gets its usual
    noise too."""

    def __init__(self, source: NormalSource, shapes: Sequence[tuple[int, ...]]) -> None:
        self._source = source
        self._count = sum(int(np.prod(shape, dtype=np.int64)) for shape in shapes)
        self._drawn: np.ndarray | None = None
        self._error: BaseException | None = None
        self._used = 0
        self._thread = threading.Thread(target=self._draw, name="prefetch-noise", daemon=True)
        self._thread.start()

    def _draw(self) -> None:
        try:
            # NumPy releases the GIL while it fills the array: the server's main thread runs meanwhile.
            self._drawn = self._source.normal(0.0, 1.0, (self._count,))
        except BaseException as exc:  # re-raised to whoever asks for the noise
            self._error = exc

    def normal(self, loc: float, scale: float, size: tuple[int, ...]) -> np.ndarray:
        """``loc + scale · z`` with ``z`` the next standard normals of the stream, shaped ``size``."""
        self._thread.join()
        if self._error is not None:
            raise RuntimeError("drawing the prefetched noise failed") from self._error
        assert self._drawn is not None
        wanted = int(np.prod(size, dtype=np.int64))
        ahead = self._drawn[self._used : self._used + wanted]
        self._used += len(ahead)
        if len(ahead) < wanted:  # past the prefetched run: the stream goes on
            ahead = np.concatenate([ahead, self._source.normal(0.0, 1.0, (wanted - len(ahead),))])
        # loc + scale·z in place: the run is this round's own and each value is handed out once.
        result = ahead.reshape(size)
        np.multiply(result, scale, out=result)
        np.add(result, loc, out=result)
        return result
