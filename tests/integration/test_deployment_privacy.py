"""Privacy against a real deployment on 127.0.0.1 (`flower-superlink` + one `flower-supernode` per client,
`population=nodes`): who takes part is secret, and the published files hold no client-derived value by default.
On the same deployment, DP-FTRL's participation rule is enforced against SuperNodes that ask to train
every round.

Two `flwr run`s with the same config and seed against the same SuperLink, started together with the DP-FTRL run (a
SuperNode serves several runs; each message's run id is in its log): each SuperNode's log says in which rounds it
received a train message ("[RUN r, ROUND t]" then "Receiving: train message"), which is the sampling that ran.
With secure randomness (the default against a real SuperLink) the two runs sample differently (equal with
probability 2^-(nodes·rounds)); the accountant accounts Poisson sampling at rate q for every round; and with
``client_statistics`` at its default (none in deployment) neither metrics.jsonl, run.json nor the logs carry a
per-client value.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.processes import stop_process_group
from fl_app.checkpoint import load_checkpoint
from fl_app.metrics import CLIENT_COUNTS, OPERATOR_FILE, read_metrics
from fl_app.privacy.accountants import compute_epsilon
from fl_app.privacy.mechanisms.participation import ParticipationRecord, ParticipationRule
from strategies.statistics import CLIENT_DERIVED
from tests.integration.deploy import Deployment, deployment, start_flwr_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

NODES, ROUNDS, Q, SIGMA = 4, 3, 0.5, 0.1  # two runs sample alike with probability 2^-12


def _run_config(out: Path) -> str:
    hydra = (
        f"dataset.num_clients={NODES} dataset.max_train_samples=200 dataset.max_test_samples=200 "
        f"privacy.sample_rate={Q} privacy.noise_multiplier={SIGMA} round_timeout=120"
    )
    return f"num_rounds={ROUNDS} eval_every={ROUNDS} population='nodes' output_dir='{out}' overrides='{hydra}'"


def _participation(log: str) -> tuple[list[str], dict[str, set[int]]]:
    """The run ids in the order this SuperNode first heard of them (every run first queries every node for its
    partition), and per run id the rounds in which it received a train message."""
    order: list[str] = []
    rounds: dict[str, set[int]] = {}
    current: tuple[str, int] | None = None
    for line in log.splitlines():
        header = re.search(r"\[RUN (\d+)(?:, ROUND (\d+))?\]", line)
        if header:
            if header.group(1) not in order:
                order.append(header.group(1))
            current = (header.group(1), int(header.group(2))) if header.group(2) else None
        elif current and "Receiving: train message" in line:
            rounds.setdefault(current[0], set()).add(current[1])
    return order, rounds


@dataclass
class Finished:
    """A ``flwr run`` of this module's deployment, finished: its output dir, exit code, what it printed and run id."""

    out: Path
    returncode: int
    printed: str
    run_id: str


#: The module's runs: two with the same config and seed (secret sampling), and DP-FTRL's (participation rule).
RUNS = ("run_a", "run_b", "ftrl")


def _ftrl_config(out: Path) -> str:
    hydra = (
        f"strategy=dp_ftrl_fedavg dataset.num_clients={NODES} dataset.max_train_samples=200 "
        f"dataset.max_test_samples=200 privacy.sampling=available privacy.sample_rate=0.5 "
        f"privacy.min_separation=2 privacy.noise_multiplier=1.0 round_timeout=120"
    )
    return f"num_rounds=4 eval_every=4 population='nodes' output_dir='{out}' overrides='{hydra}'"


@pytest.fixture(scope="module")
def deployed() -> Iterator[tuple[Deployment, dict[str, Finished]]]:
    """One SuperLink with NODES SuperNodes and the module's three runs on it, started together (each `flwr run` is
    a run of its own; a SuperNode logs each message's run id beside it, so the logs stay apart)."""
    with tempfile.TemporaryDirectory(prefix="dpfs", dir="/tmp") as d, deployment(Path(d), NODES, tls=False) as dep:
        tmp = Path(d)
        configs = {"run_a": _run_config(tmp / "run_a"), "run_b": _run_config(tmp / "run_b"),
                   "ftrl": _ftrl_config(tmp / "ftrl")}  # fmt: skip
        started = {name: start_flwr_run(dep.env, dep.connection, configs[name], tmp / f"{name}.log") for name in RUNS}
        finished = {}
        try:
            for name, proc in started.items():
                returncode = proc.wait(timeout=500)
                printed = (tmp / f"{name}.log").read_text(errors="replace")
                found = re.search(r"Successfully started run (\d+)", printed)
                finished[name] = Finished(tmp / name, returncode, printed, found.group(1) if found else "")
        finally:
            for proc in started.values():
                stop_process_group(proc)
        yield dep, finished


def _logs(dep: Deployment) -> dict[str, str]:
    return {name: path.read_text(errors="replace") for name, path in dep.logs.items()}


def test_sampling_is_secret_and_nothing_per_client_is_published(
    deployed: tuple[Deployment, dict[str, Finished]],
) -> None:
    dep, finished = deployed
    runs = [finished["run_a"], finished["run_b"]]
    logs = _logs(dep)
    for run in runs:
        assert run.returncode == 0 and run.run_id, run.printed[-3000:] + dep.tails()
    outs = [run.out for run in runs]

    # Which rounds each node trained in, per run: the sampling that actually ran.
    per_node = [_participation(logs[f"supernode{i}"])[1] for i in range(NODES)]
    matrices = [[sorted(node.get(run.run_id, set())) for node in per_node] for run in runs]
    assert matrices[0] != matrices[1], matrices  # the same config and seed, different samples

    for out, matrix in zip(outs, matrices, strict=True):
        records = read_metrics(out / "metrics.jsonl")
        counts = read_metrics(out / OPERATOR_FILE)  # the operator's own record, never published
        assert [r["round"] for r in records] == [c["round"] for c in counts] == list(range(1, ROUNDS + 1))
        for r, c in zip(records, counts, strict=True):
            # The server sent a message to exactly the nodes whose logs show one, and accounted Poisson(q).
            assert c["sampled"] == sum(r["round"] in rounds for rounds in matrix), (c, matrix)
            assert r["epsilon"] == pytest.approx(compute_epsilon(SIGMA, Q, r["round"], 1 / NODES), rel=1e-9)
            # client_statistics: none, the deployment default: no client-derived value, no count of clients.
            assert not (set(CLIENT_DERIVED) | set(CLIENT_COUNTS)) & set(r), r
        meta = json.loads((out / "run.json").read_text())
        assert meta["sampling_source"] == meta["noise_source"] == "os-csprng"
        assert meta["sampling_event"] == "poisson" and meta["rounds_accounted"] == ROUNDS
        assert meta["client_statistics"].startswith("none")
        assert not set(CLIENT_DERIVED) & set(meta) and "client_norms" not in json.dumps(meta)
    for run in runs:
        # The progress line has no client-derived value and no count of clients.
        assert "train acc - |" in run.printed
        assert not re.search(r"clients \d+/\d+", run.printed)
    for text in [*(run.printed for run in runs), *logs.values()]:
        assert "pre_clip_norm" not in text and "client_norms" not in text


def test_dp_ftrl_refuses_supernodes_that_ask_to_train_too_often(
    deployed: tuple[Deployment, dict[str, Finished]],
) -> None:
    """Every SuperNode is connected, so asks to train, in every round; the rule (b = 2, k = 2 in 4 rounds, at most
    m = 2 a round) lets each train in every other round only. The node logs, the checkpointed record, the published
    refusal counts and the epsilon of the factorization (no amplification) agree."""
    dep, finished = deployed
    run = finished["ftrl"]
    out = run.out
    assert run.returncode == 0 and run.run_id, run.printed[-3000:] + dep.tails()
    parsed = [_participation(text) for name, text in sorted(_logs(dep).items()) if name.startswith("supernode")]
    trained = [sorted(rounds.get(run.run_id, set())) for _, rounds in parsed]
    record = ParticipationRecord(ParticipationRule(2, 2))
    for server_round in range(1, 5):
        clients = [node for node, rounds in enumerate(trained) if server_round in rounds]
        assert len(clients) == 2, trained  # two nodes are always eligible: the round is full
        record.record(clients, server_round)  # raises if the nodes' logs show a violation of the rule
    stored = ParticipationRecord(ParticipationRule(2, 2))
    stored.load_state_dict(load_checkpoint(out).strategy_state["participation"])
    assert stored == record
    records = read_metrics(out / "metrics.jsonl")
    assert [r["participation_refused"] for r in records] == [0, 2, 2, 2]
    meta = json.loads((out / "run.json").read_text())
    assert meta["participation_rule"] == "each client at most k=2 times, at least b=2 rounds apart"
    assert meta["sampling"] == "available" and meta["amplification"].startswith("none")
    assert meta["noise_source"] == "os-csprng" and "rounds apart" in meta["dp_guarantee"]
