"""Distributed DP through the real ClientApp in this process (Flower's wire format, no Ray): the four stages of
secure aggregation each round, the released model the clipped sum plus the clients' Skellam noise, what the server
receives, dropouts, and both guarantees in the run's claim. (A real deployment is
tests/integration/test_deployment.py::test_tls_runs_complete_when_a_node_dies_mid_run_central_and_distributed.)"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity
from scipy import stats

from apps.client_app import app as our_app
from fl_app.checkpoint import load_checkpoint
from fl_app.models import build_model_for_dataset, get_weights
from fl_app.privacy.distributed import SkellamCodec
from fl_app.secure_aggregation.messages import MESSAGE_TYPE, PARTICIPANT, RECORD, STAGE, vector_from_bytes
from tests.helpers import InProcessGrid, build

pytestmark = pytest.mark.usefixtures("fashion_mnist")

SMALL = ("dataset.num_clients=6", "privacy.sample_rate=0.5", "dataset.max_train_samples=300", "model.name=cnn")
DISTRIBUTED = ("privacy.placement=distributed", "privacy.client_statistics=none", *SMALL)


def _weights(strategy) -> list[np.ndarray]:
    return get_weights(build_model_for_dataset(strategy.config.model.name, strategy.config.dataset.name, seed=0))


class RecordingGrid(InProcessGrid):
    """The in-process grid, keeping every reply the server received."""

    def __init__(self, nodes: int, app: ClientApp) -> None:
        super().__init__(nodes=nodes, app=app)
        self.received: list[Message] = []

    def _deliver(self, message):
        reply = super()._deliver(message)
        self.received.append(reply)
        return reply


def _run(*overrides: str, rounds: int = 2, app: ClientApp = our_app, **run):
    strategy = build(*DISTRIBUTED, *overrides, **run)
    grid = RecordingGrid(6, app)
    initial = _weights(strategy)
    result = strategy.start(grid, ArrayRecord(initial), num_rounds=rounds, timeout=60)
    return strategy, grid, initial, result.arrays.to_numpy_ndarrays()


@pytest.fixture(scope="module")
def two_rounds(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """Two rounds, checkpointed in the run's directory (``strategy.checkpoint_dir``)."""
    with pytest.MonkeyPatch.context() as patch:  # the task identity conftest.py fakes for each test
        for name, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 0)):
            patch.setattr(TaskIdentity, name, value)
        return _run(checkpoint_dir=tmp_path_factory.mktemp("distributed"))


def test_a_round_is_four_stages_and_the_claim_states_both_adversaries(two_rounds: tuple) -> None:
    strategy, grid, initial, final = two_rounds
    types = {reply.metadata.message_type for reply in grid.received}
    assert types <= {MESSAGE_TYPE, "query"}
    assert any(not np.array_equal(a, b) for a, b in zip(initial, final, strict=True))
    claim = strategy.dp_guarantee()
    assert claim["placement"] == "distributed" and claim["rounds_accounted"] == 2
    assert 0 < claim["epsilon"] < claim["server_epsilon"] < np.inf
    assert "against the server" in claim["dp_guarantee"]
    assert claim["distributed"]["bits"] == 32 and claim["distributed"]["min_survivors"] == 2


def test_the_server_receives_no_update_only_masked_vectors_uniform_modulo_2_to_the_b(two_rounds: tuple) -> None:
    _, grid, _, _ = two_rounds
    stage_replies = [r for r in grid.received if r.metadata.message_type == MESSAGE_TYPE]
    assert stage_replies and all(not r.content.array_records for r in stage_replies)
    masked = [r.content.config_records[RECORD]["masked"] for r in stage_replies if "masked" in r.content[RECORD]]
    assert len(masked) >= 4  # two rounds of at least two clients
    bits = 32
    for data in masked:
        vector = vector_from_bytes(bytes(data), bits, len(data) // 4)
        assert stats.kstest(vector / 2.0**bits, "uniform").pvalue > 1e-4


def test_a_resume_restores_both_ledgers_and_continues(two_rounds: tuple) -> None:
    strategy, _, initial, _ = two_rounds
    resumed = build(*DISTRIBUTED, checkpoint_dir=strategy.checkpoint_dir,
                    resume_from=load_checkpoint(strategy.checkpoint_dir))  # fmt: skip
    assert resumed.epsilon() == strategy.epsilon()
    assert resumed.account.ledger.server_epsilon() == strategy.account.ledger.server_epsilon()
    resumed.start(RecordingGrid(6, our_app), ArrayRecord(initial), num_rounds=3, timeout=60)
    assert resumed.dp_guarantee()["rounds_accounted"] == 3 and resumed.epsilon() > strategy.epsilon()


def test_a_target_epsilon_calibrates_sigma_on_the_skellam_bound_and_the_claim_states_it() -> None:
    strategy = build(*DISTRIBUTED, "privacy.target_epsilon=3.0", "num_rounds=4")
    parameters = strategy.placement.parameters
    assert strategy.noise_multiplier == parameters.noise_multiplier != strategy.config.privacy.noise_multiplier
    assert 3.0 * 0.995 <= strategy.account.ledger.projected_epsilon(strategy.noise_multiplier, 0.5, 4) <= 3.0
    stated = strategy.dp_guarantee()["distributed"]
    assert stated["noise_multiplier"] == parameters.noise_multiplier
    assert stated["effective_noise_multiplier"] >= parameters.noise_multiplier


@pytest.mark.parametrize(("overrides", "threshold"), [((), 20), (("+scale=cpu",), 2)])
def test_the_default_threshold_is_the_largest_whose_visible_aborts_add_a_tenth_of_delta(overrides, threshold) -> None:
    # M = 500, q = 0.1, T = 20, ε = 4 (tests/privacy/distributed/test_mechanism.py); the cpu scale's m = 10: none.
    strategy = build("privacy=distributed", "privacy.client_statistics=none", "privacy.target_epsilon=4", *overrides)
    assert strategy.placement.parameters.min_clients == threshold


def test_the_released_model_is_the_clipped_sum_plus_the_clients_noise() -> None:
    """At a tiny σ the distributed round releases what the server-placement round releases from the same clients
    (the same seeded training), up to the noise (norm about σC√d in both) and the rounding."""
    tiny = ("privacy.noise_multiplier=1e-6",)
    _, _, initial, distributed = _run(*tiny, rounds=1)
    central = build(*SMALL, *tiny, "privacy.client_statistics=none", "simulation.cohort_size=1")
    final = central.start(InProcessGrid(6), ArrayRecord(initial), num_rounds=1, timeout=60).arrays.to_numpy_ndarrays()
    moved = np.sqrt(sum(float(np.sum((f - i) ** 2)) for f, i in zip(final, initial, strict=True)))
    apart = np.sqrt(sum(float(np.sum((d - f) ** 2)) for d, f in zip(distributed, final, strict=True)))
    assert moved > 0.05 and apart < 0.05 * moved


def _dropping(stage: str, participant_count: int = 1) -> ClientApp:
    """Our ClientApp, except that the first ``participant_count`` participants to reach ``stage`` fail it."""
    failed: set[int] = set()

    def handler(message: Message, context: Context) -> Message:
        if message.metadata.message_type == MESSAGE_TYPE:
            request = message.content.config_records[RECORD]
            participant = int(request[PARTICIPANT])
            if request[STAGE] == stage and (participant in failed or len(failed) < participant_count):
                failed.add(participant)
                raise ConnectionError(f"participant {participant} dropped at {stage}")
        return our_app(message, context)

    return handler  # type: ignore[return-value]


@pytest.mark.parametrize("stage", ["share_keys", "collect", "unmask"])
def test_a_client_dropping_out_is_survived_and_the_accounting_is_unchanged(stage: str) -> None:
    strategy, _, initial, final = _run("privacy.sample_rate=0.9", rounds=1, app=_dropping(stage))
    outcome = strategy.last_outcome
    assert outcome is not None and outcome.stats["aggregated"] >= 2
    assert any(not np.array_equal(a, b) for a, b in zip(initial, final, strict=True))
    # Accounted at the guaranteed minimum of survivors: a dropout changes nothing of epsilon, which is one release's.
    one_release = build(*DISTRIBUTED, "privacy.sample_rate=0.9").account.budget.projected_epsilon()
    assert strategy.epsilon() == pytest.approx(one_release, rel=1e-12)


def test_a_sample_below_the_threshold_aborts_the_round_unmasked_and_accounted() -> None:
    # t = 6 of M = 6 at q = 0.5: the seeded sample of round 1 is smaller, so nothing is sent or unmasked.
    strategy, grid, initial, final = _run("+privacy.distributed.threshold=6", rounds=1)
    assert not [r for r in grid.received if r.metadata.message_type == MESSAGE_TYPE]
    assert all(np.array_equal(a, b) for a, b in zip(initial, final, strict=True))
    assert strategy.dp_guarantee()["rounds_accounted"] == 1


def test_a_plain_train_message_of_a_distributed_round_is_refused_by_the_client() -> None:
    strategy = build(*DISTRIBUTED)
    grid = InProcessGrid(6)  # our plain train handler, as a loop that sends the train messages itself would reach
    messages = strategy.configure_train(1, ArrayRecord(_weights(strategy)), ConfigRecord(), grid)
    replies = grid.send_and_receive(list(messages)[:1])
    assert replies[0].has_error() and "only through secure aggregation" in replies[0].error.reason


AUDITED = ("audit=canaries", "audit.canaries=400", "audit.support=100", "privacy.delta=1e-5")


def test_the_canary_audit_holds_on_a_distributed_run() -> None:
    strategy, _, _, _ = _run(*AUDITED, rounds=2)
    result = strategy.auditor.result
    assert result is not None and result.round == 2
    assert result.accountant_epsilon == pytest.approx(strategy.epsilon(), rel=1e-12)
    assert not result.violation and not result.alarm


def test_the_audit_flags_a_build_whose_clients_add_no_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """A weakened build: every client's Skellam share is zero while the ledger still accounts σ — the canaries,
    added to the decoded sum as a client's clipped update would be, stand out."""
    monkeypatch.setattr(SkellamCodec, "noise", lambda self, rng: np.zeros(self.rotation.padded, dtype=np.int64))
    strategy, _, _, _ = _run(*AUDITED, rounds=2)
    result = strategy.auditor.result
    assert result is not None and result.alarm
    assert result.alarm_epsilon > 100 * result.accountant_epsilon
    assert "PRIVACY ALARM" in strategy.dp_guarantee()["dp_guarantee"]
