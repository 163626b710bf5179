"""A client of distributed DP (docs/mechanisms.md, "Distributed DP"): SecAgg+'s four stages
(fl_app/secure_aggregation/client.py) with the round's training and encoding in the third.

Each ``train.secagg`` message is one stage for one participant (a client's partition id); the participant's
protocol state stays in the node's Context between stages (``secagg.<participant>``), and is dropped after the
unmask stage. At the collect stage the client trains exactly as a train message would have it (the round's
instructions: local SGD or SAM, the recipe's clip to C — the server's Gaussian noise is not the client's), then
encodes its clipped update (rotation, scale, conditional rounding) and adds its Skellam share of the sum's noise
(:class:`~fl_app.privacy.distributed.SkellamCodec`), and masks it: only the masked vector leaves. A client whose
update cannot be used (a failure, a non-finite update) encodes zeros, so that its noise share is still in the sum.
Its rounding and noise come from the OS CSPRNG under secure randomness, else from the seeded stream (seed, round,
partition).
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict

from fl_app.instructions import STREAM_DISTRIBUTED_SHARE, TrainInstructions
from fl_app.privacy.distributed import SkellamCodec, SkellamParameters
from fl_app.privacy.mechanisms import make_rng
from fl_app.secure_aggregation.client import ClientSecAgg
from fl_app.secure_aggregation.messages import (
    ENCODING_KEYS,
    PARTICIPANT,
    RECORD,
    ROTATION_SEED,
    STAGE,
    Stage,
    vector_to_bytes,
)

__all__ = ["answer_stage"]


def answer_stage(msg: Message, context: Context) -> Message:
    """This participant's answer to one stage of secure aggregation."""
    request = msg.content.config_records[RECORD]
    participant = int(request[PARTICIPANT])
    key = f"{RECORD}.{participant}"
    stage = Stage(str(request[STAGE]))
    if stage is Stage.SETUP:
        state = ClientSecAgg(participant, int(request["threshold"]), int(request["bits"]), int(request["length"]))
        mask_key, share_key = state.setup()
        reply: dict[str, Any] = {"mask_key": mask_key, "share_key": share_key}
    else:
        if key not in context.state.config_records:
            raise RuntimeError(f"secure aggregation stage {stage.value} for participant {participant} before setup")
        state = ClientSecAgg.from_record(context.state.config_records[key])
        reply = _stage(stage, state, request, msg)
    if stage is Stage.UNMASK:
        del context.state.config_records[key]
    else:
        context.state.config_records[key] = ConfigRecord(state.to_record())  # type: ignore[arg-type]
    return Message(RecordDict({RECORD: ConfigRecord(reply)}), reply_to=msg)


def _stage(stage: Stage, state: ClientSecAgg, request: Any, msg: Message) -> dict[str, Any]:
    if stage is Stage.SHARE_KEYS:
        ids = [int(n) for n in request["neighbours"]]
        keys = dict(zip(ids, zip(request["mask_keys"], request["share_keys"], strict=True), strict=True))
        destinations, ciphertexts = state.share_keys({n: (bytes(m), bytes(s)) for n, (m, s) in keys.items()})
        return {"destinations": destinations, "ciphertexts": ciphertexts}
    if stage is Stage.COLLECT:
        vector = _encoded_update(msg, request, state.node_id)
        sources = [int(n) for n in request["sources"]]
        masked = state.masked(sources, [bytes(c) for c in request["ciphertexts"]], vector)
        return {"masked": vector_to_bytes(masked, state.bits)}
    owners, shares = state.unmask([int(n) for n in request["survivors"]], [int(n) for n in request["dropped"]])
    return {"owners": owners, "shares": shares}


def _encoded_update(msg: Message, request: Any, participant: int) -> np.ndarray:
    """Train the participant as the round's instructions say, and encode its clipped update with its noise share."""
    from clients.cohort import train_cohort  # the training stack (torch) only where a client trains
    from fl_app.instructions import resolve_cohort_engine
    from fl_app.models import resolve_device

    config = msg.content["config"]
    ins = TrainInstructions.from_config(config)
    parameters = msg.content["arrays"].to_numpy_ndarrays()
    faults = [str(f) for f in config["faults"]]
    engine = resolve_cohort_engine(ins.cohort_engine, resolve_device(ins.device).type == "cuda")
    result = train_cohort(parameters, ins, [participant], faults, engine, None)
    if result.accepted:
        flat = np.concatenate([np.asarray(t, dtype=np.float64).reshape(-1) for t in result.total])
    else:  # nothing usable: zeros, and the share of the noise all the same
        flat = np.zeros(sum(int(np.prod(p.shape)) for p in parameters), dtype=np.float64)
    encoding = SkellamParameters(**{key: request[key] for key in ENCODING_KEYS})
    codec = SkellamCodec(encoding, int(request[ROTATION_SEED]))
    rng = (
        np.random.Generator(np.random.Philox(key=secrets.randbits(128)))
        if ins.seed is None
        else make_rng(ins.seed, ins.server_round, STREAM_DISTRIBUTED_SHARE, participant)
    )
    return codec.encode(flat, rng)
