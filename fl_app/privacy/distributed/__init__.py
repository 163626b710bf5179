"""Distributed DP: each client noises its own integer-encoded update, secure aggregation reveals only the sum, and
the sum carries the whole noise (the distributed Skellam mechanism; docs/mechanisms.md, "Distributed DP").

- :mod:`.rotation`: the randomised Hadamard rotation that spreads an update over its coordinates;
- :mod:`.encoding`: conditional randomised rounding, the rounding's norm bound, arithmetic modulo 2^b, wrap flags;
- :mod:`.skellam`: the Skellam noise, the overflow bound, and a round's parameters (scale, variance, sensitivity);
- :mod:`.codec`: a client's encoding and the server's decoding of one round.

Its accounting is ``fl_app.privacy.accountants.skellam``.
"""

from fl_app.privacy.distributed.codec import DecodedSum, SkellamCodec
from fl_app.privacy.distributed.skellam import SkellamParameters, overflow_probability, skellam_noise

__all__ = ["DecodedSum", "SkellamCodec", "SkellamParameters", "overflow_probability", "skellam_noise"]
