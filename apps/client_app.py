"""Flower ClientApp (Message API: train and query handlers, the non-deprecated path in Flower 1.42).

One message format and one reply format: every train message names its partitions (a cohort in simulation's cohort
mode, a cohort of one per client or per SuperNode) and is trained by :func:`clients.cohort.train_cohort`, which
privatizes and screens each client on its own and answers with the float64 sum of the accepted clients' updates,
each client's statistics and the fate of the others. The same app serves ``flwr run`` simulations, the Hydra entry
point and real SuperNodes. (Our client as a Flower ``NumPyClient``, one client per message, is
clients/numpy_client.py: the same :func:`~clients.cohort.train_cohort` with a cohort of one, answering in Flower's
convention, each partition of a cohort message answered apart: clients/numpy_mod.py.)

Importing it sets Ray's environment (:func:`apps.local_ray.use_ray_env`): under ``flwr run`` Flower's simulation
process loads this app before it starts Ray, whose raylet and workers then inherit it. Importing it does not load
torch: the first train message does (a deployed SuperNode answers each message, a query too, in a new process).
"""

from __future__ import annotations

import time

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from apps.local_ray import use_ray_env
from fl_app.node_queries import answer_query

use_ray_env()

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the partitions the message names (a cohort, or a cohort of one) and answer with their sum, each
    client's statistics and fate (:class:`fl_app.instructions.CohortReply`)."""
    # The training stack (torch, ~3 s to import on 2 cores) is loaded by the first train message, not with the app: a
    # SuperNode starts a ClientApp process for every message, and a query needs none of it.
    import torch

    from clients.cohort import train_cohort
    from fl_app.allocator import freeze_imported_objects, keep_freed_memory
    from fl_app.instructions import CohortReply, TrainInstructions, resolve_cohort_engine
    from fl_app.models import resolve_device
    from fl_app.threads import limit_library_threads

    fit_started = time.time()
    # torch's threads are the CPUs Ray gave this worker; NumPy's BLAS must not spin on the other cores.
    limit_library_threads(torch.get_num_threads())
    # Local steps reuse freed buffers instead of page-faulting them in again (1.25x on the CPU step; see the module),
    # and full garbage collections no longer walk the imported modules' objects.
    keep_freed_memory()
    freeze_imported_objects()
    config = msg.content["config"]
    shared_mask = None
    if "mask" in msg.content:
        shared_mask = [m.astype(bool) for m in msg.content["mask"].to_numpy_ndarrays()]
    parameters = msg.content["arrays"].to_numpy_ndarrays()
    ins = TrainInstructions.from_config(config)
    if ins.secure_aggregation:  # the client's own guard: its update leaves only masked (distributed DP)
        raise PermissionError("this round's update may leave the client only through secure aggregation (train.secagg)")
    partition_ids = [int(pid) for pid in config["partition_ids"]]
    faults = [str(f) for f in config["faults"]]
    engine = resolve_cohort_engine(ins.cohort_engine, resolve_device(ins.device).type == "cuda")
    result = train_cohort(parameters, ins, partition_ids, faults, engine, shared_mask)
    stamps = {"fit_started_unix": fit_started}
    if result.accepted:
        stamps["train_started_unix"] = result.train_started_unix
    reply = CohortReply(
        total=result.total,
        accepted=result.accepted,  # type: ignore[arg-type]
        metrics=result.metrics,
        rejected=result.rejected,  # type: ignore[arg-type]
        reclipped=result.reclipped,
        num_examples=result.num_examples,
        timestamps=stamps,
    )
    return Message(reply.to_record(), reply_to=msg)


@app.train("secagg")
def secure_aggregation(msg: Message, context: Context) -> Message:
    """One stage of secure aggregation for one client (distributed DP: clients/secure_aggregation.py); the collect
    stage trains and encodes the client's update, and only its masked vector leaves."""
    from clients.secure_aggregation import answer_stage

    return answer_stage(msg, context)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Answer the server's queries before the first round (fl_app/node_queries.py): this node's partition
    (``population=nodes``), and that this app trains the partition each message names (``population=virtual``)."""
    return answer_query(msg, context.node_config)
