"""Secure aggregation on Flower's Message API (SecAgg+: Bell et al., CCS 2020; SecAgg: Bonawitz et al., CCS 2017):
the server learns the sum of the surviving clients' vectors modulo 2^b and nothing else about any one of them.

- :mod:`.masks`: the self and pairwise masks (ChaCha20), the random Harary neighbourhood graph;
- :mod:`.client`: a client's four stages over its state (:class:`~.client.ClientSecAgg`);
- :mod:`.server`: the server's state machine over one round (:class:`~.server.SecureSumRound`);
- :mod:`.messages`: the message type, record and stage names, vectors as bytes.

Built from Flower's primitives (Shamir sharing, ECDH, Fernet: ``flwr.common.secure_aggregation``,
``flwr.supercore.primitives.asymmetric``); Flower's own SecAgg+ workflow is a ``LegacyContext`` workflow and its
mask generator has a 32-bit seed, so neither is used.
"""

from fl_app.secure_aggregation.client import ClientSecAgg, ProtocolError
from fl_app.secure_aggregation.server import SecureSumRound

__all__ = ["ClientSecAgg", "ProtocolError", "SecureSumRound"]
