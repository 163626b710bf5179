"""The least any app on Flower's simulation engine takes to its first local step.

``python -m bench.flower_floor BACKEND_CONFIG_JSON NODES WORKERS OUT_JSON [app|flower]`` runs Flower's
``run_simulation`` with the app's backend config (its ``ray.init`` arguments and client resources) and ``NODES``
SuperNodes, Ray started as the app starts it (``app``, the default: :func:`apps.local_ray.start_local_ray`) or
by Flower's backend (``flower``: a job runtime_env, so the actors wait for fresh worker processes), a ServerApp
that sends one train message to each of ``WORKERS`` nodes (the actor pool's size) as soon as they are registered,
and a ClientApp that imports torch (as every ClientApp worker that trains does) and notes the time before one tiny
step. Nothing of the app is imported: no config, no data, no model, no strategy. ``OUT_JSON`` gets
``first_step_unix`` (the earliest worker's); bench/floors.py times it from the command's start.

Against pfl-research's command → first local step this says whether "below pfl" is reachable at all inside
Flower's Ray engine; against the app's it says how much of the app's startup is its own.

``python -m bench.flower_floor --rounds PLAN_JSON BACKEND_CONFIG_JSON NODES WORKERS OUT_JSON`` is the same for a
round: the least FedAvg on Flower's engine, run as the app runs it (its Ray start, its prompt delivery of messages
and replies: apps/delivery.py, strategies/messaging.py), for the workload of ``PLAN_JSON`` (bench/floors.py's
:func:`~bench.floors.flower_round_floor` writes it from the app's run: per round, the app's cohorts, each a list of
its clients' batch sizes). The ServerApp sends each worker the model (an ``ArrayRecord``) and its cohort; the
ClientApp trains every client of it from the model with the bare local step (the compute limit's: forward,
backward and the app's SGD step — SAM's two passes for SAM — at the client's batch sizes, on one fixed random
batch: no data, no shuffle, no bookkeeping, no privacy) and replies with the float32 sum of the clients' updates;
the server (which imports no torch) adds the average to the model. ``OUT_JSON`` gets the Unix time of every
round's end: what Flower's engine, its messages, the cohorts' imbalance and the bare steps cost a round, and
nothing else.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

#: Module level, so that the Ray workers import it by reference (the ServerApp runs in this process).
client = ClientApp()


@client.train()
def _train(msg: Message, context: Context) -> Message:
    import torch

    started = time.time()
    layer = torch.nn.Conv2d(1, 8, 3)
    layer(torch.randn(32, 1, 28, 28)).sum().backward()
    return Message(RecordDict({"floor": MetricRecord({"started": started})}), reply_to=msg)


#: The round floor's ClientApp (module level for the same reason).
round_client = ClientApp()
_STEPPER: dict[str, Any] = {}


def _stepper(spec: dict[str, Any]) -> Any:
    """The worker's model, fixed random batch and step (built once per worker process): the compute limit's."""
    if "model" not in _STEPPER:
        import torch

        from clients.training import sgd_kernels
        from fl_app.allocator import keep_freed_memory
        from fl_app.models import build_model, to_compute_layout

        torch.set_num_threads(1)
        keep_freed_memory()  # as the app's workers run
        cpu = torch.device("cpu")
        model = to_compute_layout(build_model(spec["model"], seed=spec["seed"], **spec["model_kwargs"]), cpu)
        generator = torch.Generator().manual_seed(0)
        kw = spec["model_kwargs"]
        x = torch.randn(spec["batch_size"], kw["in_channels"], kw["image_size"], kw["image_size"], generator=generator)
        y = torch.randint(0, kw["num_classes"], (spec["batch_size"],), generator=generator)
        _STEPPER.update(model=model, x=x, y=y, kernels=sgd_kernels(cpu))
    return _STEPPER


@round_client.train()
def _train_round(msg: Message, context: Context) -> Message:
    import numpy as np
    import torch
    import torch.nn.functional as F

    spec = json.loads(str(msg.content["config"]["spec"]))
    cohort = json.loads(str(msg.content["config"]["cohort"]))
    s = _stepper(spec)
    model, x, y = s["model"], s["x"], s["y"]
    params = list(model.parameters())
    start = msg.content["model"].to_numpy_ndarrays()
    total = [np.zeros_like(w) for w in start]
    for sizes in cohort:
        with torch.no_grad():
            for p, w in zip(params, start, strict=True):
                p.copy_(torch.from_numpy(w))
        opt = torch.optim.SGD(
            params, lr=spec["lr"], momentum=spec["momentum"], weight_decay=spec["weight_decay"], **s["kernels"]
        )
        for b in sizes:
            xb, yb = x[:b], y[:b]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xb), yb).backward()
            if spec["sam"]:  # SAM's second pass, as in the compute limit
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(xb), yb).backward()
            opt.step()
        for acc, p, w in zip(total, params, start, strict=True):
            acc += p.detach().numpy() - w
    return Message(RecordDict({"sum": ArrayRecord(total)}), reply_to=msg)


def round_server(plan: dict[str, Any], workers: int, result: dict[str, Any]) -> ServerApp:
    """A ServerApp that runs ``plan``'s rounds (module docstring) on ``workers`` nodes and appends each round's end
    (Unix time) to ``result["round_ends"]``."""
    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        import numpy as np

        from strategies.messaging import send_and_receive

        spec = plan["spec"]
        # The model's shapes from the plan, its values from NumPy: the server imports no torch (an app whose server
        # evaluates nothing needs none), and the step's cost does not depend on the weights' values.
        rng = np.random.default_rng(spec["seed"])
        weights = [(0.01 * rng.standard_normal(shape)).astype(np.float32) for shape in spec["shapes"]]
        nodes: list[int] = []
        while len(nodes) < workers:
            nodes = sorted(grid.get_node_ids())[:workers]
            time.sleep(0.01)
        result["round_ends"] = [time.time()]
        for cohorts in plan["rounds"]:
            if len(cohorts) > len(nodes):
                raise ValueError(f"flower_floor: a round of {len(cohorts)} cohorts for {len(nodes)} workers")
            messages = [
                Message(
                    RecordDict(
                        {
                            "model": ArrayRecord(weights),
                            "config": ConfigRecord({"spec": json.dumps(spec), "cohort": json.dumps(cohort)}),
                        }
                    ),
                    dst_node_id=node,
                    message_type="train",
                )
                for node, cohort in zip(nodes, cohorts, strict=False)
            ]
            replies = send_and_receive(grid, messages, timeout=None)
            errors = [reply.error.reason for reply in replies if reply.has_error()]
            if errors or len(replies) != len(messages):
                raise RuntimeError(f"flower_floor: {len(replies)} replies to {len(messages)}; errors {errors}")
            clients = sum(len(cohort) for cohort in cohorts)
            sums = [reply.content["sum"].to_numpy_ndarrays() for reply in replies]
            weights = [w + np.sum([s[i] for s in sums], axis=0) / clients for i, w in enumerate(weights)]
            result["round_ends"].append(time.time())

    return server


def floor_server(workers: int, result: dict[str, float]) -> ServerApp:
    """A ServerApp that sends one train message to each of ``workers`` nodes as soon as they are registered and
    puts the earliest reported first step into ``result`` (it runs on a thread of this process)."""
    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        nodes: list[int] = []
        while len(nodes) < workers:  # the SuperNodes register while the engine starts
            nodes = sorted(grid.get_node_ids())[:workers]
            time.sleep(0.01)
        messages = [
            Message(RecordDict({"config": ConfigRecord({"round": 1})}), dst_node_id=node, message_type="train")
            for node in nodes
        ]
        replies = list(grid.send_and_receive(messages))
        errors = [reply.error.reason for reply in replies if reply.has_error()]
        if errors or len(replies) != len(messages):
            raise RuntimeError(f"flower_floor: {len(replies)} replies to {len(messages)} messages; errors {errors}")
        result["first_step_unix"] = min(float(r.content["floor"]["started"]) for r in replies)

    return server


def main(argv: list[str]) -> int:
    from flwr.simulation import run_simulation

    if argv and argv[0] == "--rounds":
        plan = json.loads(Path(argv[1]).read_text())
        backend_config, nodes, out = json.loads(argv[2]), int(argv[3]), Path(argv[5])
        workers = min(nodes, int(argv[4]))
        from apps.delivery import deliver_promptly
        from apps.local_ray import start_local_ray

        # The engine as the app runs it: its own Ray start, messages delivered when stored (not at Flower's 0.1 s
        # polls), replies pulled when they land (strategies.messaging): the least a round on this engine costs.
        deliver_promptly()
        start_local_ray(backend_config["init_args"])
        rounds: dict[str, Any] = {}
        server = round_server(plan, workers, rounds)
        run_simulation(server_app=server, client_app=round_client, num_supernodes=nodes, backend_config=backend_config)
        if len(rounds.get("round_ends", [])) != len(plan["rounds"]) + 1:
            raise RuntimeError("flower_floor: the ServerApp did not complete its rounds")
        out.write_text(json.dumps(rounds))
        return 0
    backend_config, nodes, out = json.loads(argv[0]), int(argv[1]), Path(argv[3])
    workers = min(nodes, int(argv[2]))
    ray_start = argv[4] if len(argv) > 4 else "app"
    if ray_start not in ("app", "flower"):
        raise SystemExit(f"flower_floor: the Ray start is 'app' or 'flower', not {ray_start!r}")
    if ray_start == "app":
        from apps.local_ray import start_local_ray

        start_local_ray(backend_config["init_args"])
    result: dict[str, float] = {}
    server = floor_server(workers, result)
    run_simulation(server_app=server, client_app=client, num_supernodes=nodes, backend_config=backend_config)
    if "first_step_unix" not in result:
        raise RuntimeError("flower_floor: the ServerApp did not complete")
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
