"""What the server and a client of secure aggregation say to each other: the stages, the keys of their
``ConfigRecord``, and vectors as bytes.

Every message of the protocol is ``train.secagg`` (Flower routes it to the ClientApp's ``@app.train("secagg")``
handler) and carries one ``ConfigRecord`` under :data:`RECORD`, whose :data:`STAGE` says which of the four stages it
is; the collect stage's message also carries the round's training instructions, as a plain train message does.
Node ids travel as ints, keys, shares and ciphertexts as bytes, lists of node ids and their values as two
parallel lists.
"""

from __future__ import annotations

from enum import Enum

import numpy as np

__all__ = ["MESSAGE_TYPE", "RECORD", "STAGE", "Stage", "vector_from_bytes", "vector_to_bytes"]

#: The message type of every stage (category ``train``, action ``secagg``).
MESSAGE_TYPE = "train.secagg"
#: The ConfigRecord of a stage's request and reply.
RECORD = "secagg"
#: The key of the stage in a request.
STAGE = "stage"


class Stage(str, Enum):
    """The four stages of SecAgg+ (Bell et al. 2020, Fig. 2 / Bonawitz et al. 2017, Fig. 4)."""

    SETUP = "setup"  # the server sends the round's settings; each client answers with two public keys
    SHARE_KEYS = "share_keys"  # the neighbours' keys in; encrypted shares of the client's two secrets out
    COLLECT = "collect"  # the shares meant for the client in, with the round's instructions; its masked vector out
    UNMASK = "unmask"  # who survived and who dropped in; the shares the server needs to remove the masks out


def vector_to_bytes(vector: np.ndarray, bits: int) -> bytes:
    """A vector of residues modulo 2^bits as little-endian bytes: 4 per value up to 32 bits, else 8."""
    dtype = "<u4" if bits <= 32 else "<u8"
    return np.ascontiguousarray(vector, dtype=np.uint64).astype(dtype).tobytes()


def vector_from_bytes(data: bytes, bits: int, length: int) -> np.ndarray:
    """The inverse of :func:`vector_to_bytes` (uint64); refuses a vector of the wrong length or out of range."""
    dtype = "<u4" if bits <= 32 else "<u8"
    itemsize = 4 if bits <= 32 else 8
    if len(data) != itemsize * length:
        raise ValueError(f"a masked vector of {length} values is {itemsize * length} bytes, got {len(data)}")
    vector = np.frombuffer(data, dtype=dtype).astype(np.uint64)
    if length and int(vector.max()) >= (1 << bits):
        raise ValueError(f"a masked vector holds a value outside [0, 2^{bits})")
    return vector


#: The participant a stage is for (a client's partition id: a SuperNode of a virtual population acts for each of
#: the clients it is sent, with its own state for each).
PARTICIPANT = "participant"
#: The encoding of distributed DP, sent with the collect stage (fl_app.privacy.distributed.SkellamParameters'
#: inputs, and the round's public rotation seed).
ENCODING_KEYS = (
    "clip_norm", "dimension", "min_clients", "max_clients", "noise_multiplier", "bits", "beta", "overflow_target",
)  # fmt: skip
ROTATION_SEED = "rotation_seed"
