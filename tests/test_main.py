"""What the Hydra entry point hands Flower's Ray backend: ray.init's arguments, and a SuperNode count equal to the
number of actors the backend will create (locally, with GPUs, and on a joined cluster)."""

from __future__ import annotations

import socket
import time

import pytest
import ray
import torch

from apps.main import backend_config, check_command_line, check_ray_address, concurrent_workers, simulation_nodes
from bench.processes import free_port
from fl_app.config import compose_config


def test_local_ray_is_private_and_dashboard_free() -> None:
    init_args = backend_config(compose_config([]))["init_args"]
    # "local" even if RAY_ADDRESS is set or a `ray start` cluster runs: a bare ray.init() would join either.
    assert init_args["address"] == "local"
    assert init_args["include_dashboard"] is False
    assert "num_cpus" not in init_args and "num_gpus" not in init_args


def test_joining_a_cluster_passes_its_address_and_no_resources() -> None:
    config = compose_config(["simulation.ray_address=10.0.0.5:6379", "simulation.client_gpus=0.5"])
    backend = backend_config(config)
    assert backend["init_args"]["address"] == "10.0.0.5:6379"
    # Ray refuses num_cpus/num_gpus when connecting; the per-client share still goes to the actors.
    assert "num_cpus" not in backend["init_args"] and "num_gpus" not in backend["init_args"]
    assert backend["client_resources"] == {"num_cpus": 1, "num_gpus": 0.5}


@pytest.mark.parametrize(("gpus", "client_gpus", "expected"), [(0, 0.0, 8), (1, 0.0, 8), (1, 0.25, 4), (2, 0.5, 4)])
def test_local_workers_are_capped_by_the_visible_gpus(
    monkeypatch: pytest.MonkeyPatch, gpus: int, client_gpus: float, expected: int
) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    config = compose_config(["simulation.total_cpus=8", f"simulation.client_gpus={client_gpus}"])
    assert concurrent_workers(config) == expected
    assert simulation_nodes(config) == expected


def test_no_visible_gpu_keeps_the_cpu_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert simulation_nodes(compose_config(["simulation.total_cpus=3", "simulation.client_gpus=0.5"])) == 3


def test_cluster_nodes_are_sized_from_every_ray_node(monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = [
        {"Resources": {"CPU": 4.0, "GPU": 1.0}},
        {"Resources": {"CPU": 8.0}},
        {"Resources": {}},  # a node that left: Ray still lists it, without resources
    ]
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    cpu_only = compose_config(["simulation.ray_address=auto"])
    assert simulation_nodes(cpu_only) == 12  # 4 + 8, not this machine's cores
    gpu = compose_config(["simulation.ray_address=auto", "simulation.client_gpus=0.5"])
    assert simulation_nodes(gpu) == 2  # min(4, 1/0.5) on the GPU node, none on the CPU-only node
    few_clients = compose_config(["simulation.ray_address=auto", "dataset.num_clients=5"])
    assert simulation_nodes(few_clients) == 5


def test_cluster_sizing_needs_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(RuntimeError, match="joined"):
        simulation_nodes(compose_config(["simulation.ray_address=auto"]))


def test_population_nodes_is_one_supernode_per_client() -> None:
    config = compose_config(["population=nodes", "dataset.num_clients=7", "simulation.ray_address=auto"])
    assert simulation_nodes(config) == 7


def test_an_unreachable_cluster_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # ray.init would retry a dead address for minutes; the preflight check refuses it before Ray starts.
    port = free_port()  # nothing listens there
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}"):
        check_ray_address(f"127.0.0.1:{port}")
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(ConnectionError):
        check_ray_address("auto")
    assert time.monotonic() - start < 10


def test_a_listening_cluster_and_plain_auto_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_ray_address(f"127.0.0.1:{server.getsockname()[1]}")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    check_ray_address("auto")  # Ray resolves it, and fails at once by itself when it finds no cluster


@pytest.mark.parametrize("address", ["10.0.0.5", "host:port", ":6379"])
def test_a_malformed_address_is_a_config_error(address: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        check_ray_address(address)


def test_resources_this_machine_cannot_host_are_refused_before_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.main import check_resources
    from fl_app.config import ConfigError

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ConfigError, match=r"simulation.client_gpus=0.5: no CUDA GPU is visible"):
        check_resources(compose_config(["simulation.client_gpus=0.5"]))
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"simulation.client_cpus=4.0: more than the 2 CPU\(s\)"):
        check_resources(compose_config(["simulation.client_cpus=4"]))
    check_resources(compose_config(["simulation.client_cpus=2"]))
    # A joined cluster's resources are its own (Flower's sizing checks them once connected).
    check_resources(compose_config(["simulation.ray_address=auto", "simulation.client_gpus=0.5"]))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    check_resources(compose_config(["simulation.client_gpus=0.5"]))


def test_a_misspelt_setting_on_the_command_line_exits_2_before_hydra_composes(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        check_command_line(["--multirun", "strategy=dp_fedavg", "privacy.clip_nrom=1,2"])
    assert info.value.code == 2
    assert "privacy.clip_nrom" in capsys.readouterr().err
    check_command_line(["strategy=dp_fedavg", "privacy.clip_norm=1,2", "hydra.run.dir=x", "+experiment=table1"])
    check_command_line(["--cfg", "job", "privacy.clip_nrom=1"])  # Hydra's own flags: Hydra judges
