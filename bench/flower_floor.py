"""The least any app on Flower's simulation engine takes to its first local step (issue 22).

``python -m bench.flower_floor BACKEND_CONFIG_JSON NODES WORKERS OUT_JSON [app|flower]`` runs Flower's
``run_simulation`` with the app's backend config (its ``ray.init`` arguments and client resources) and ``NODES``
SuperNodes, Ray started as the app starts it (``app``, the default: :func:`fl_app.local_ray.start_local_ray`) or
by Flower's backend (``flower``: a job runtime_env, so the actors wait for fresh worker processes), a ServerApp
that sends one train message to each of ``WORKERS`` nodes (the actor pool's size) as soon as they are registered,
and a ClientApp that imports torch (as every ClientApp worker that trains does) and notes the time before one tiny
step. Nothing of the app is imported: no config, no data, no model, no strategy. ``OUT_JSON`` gets
``first_step_unix`` (the earliest worker's); bench/peer.py times it from the command's start.

Against pfl-research's command → first local step this says whether "below pfl" is reachable at all inside
Flower's Ray engine; against the app's it says how much of the app's startup is its own.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
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

    backend_config, nodes, out = json.loads(argv[0]), int(argv[1]), Path(argv[3])
    workers = min(nodes, int(argv[2]))
    ray_start = argv[4] if len(argv) > 4 else "app"
    if ray_start not in ("app", "flower"):
        raise SystemExit(f"flower_floor: the Ray start is 'app' or 'flower', not {ray_start!r}")
    if ray_start == "app":
        from fl_app.local_ray import start_local_ray

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
