"""strategies/client_level_dp.py: client-level DP is one layer around a plain strategy. ``ClientLevelDP(FedSAM(...))``
built by hand is ``strategy=dp_fedsam`` from Hydra, bit for bit (model and ε, through real local training: the
ClientApp's handler in this process, :class:`tests.helpers.InProcessGrid`); the strategy it wraps stays plain; what it
cannot wrap is refused before anything runs."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord
from flwr.serverapp import RdpAccountant
from flwr.serverapp.strategy import FedAdam

from fl_app.config import ConfigError, compose_config
from fl_app.models import build_model_for_dataset, get_weights
from fl_app.privacy.accountants import compute_epsilon
from fl_app.privacy.accountants.interface import privacy_config
from strategies import (
    UNIT_WEIGHT,
    ClientLevelDP,
    DPFedSAM,
    DPOverFlowerMean,
    DPOverRounds,
    FederatedAveraging,
    FedSAM,
    NoisyFedAvg,
    PrivateRounds,
)
from strategies.registry import build_strategy
from tests.helpers import InProcessGrid
from tests.strategies.conftest import task_identity  # noqa: F401  (flwr Messages need a task identity)

SMALL = [
    "dataset.num_clients=20",
    "dataset.max_train_samples=200",  # 10 images a client
    "dataset.max_test_samples=100",
    "privacy.sample_rate=0.2",
    "privacy.noise_stream=per_run",  # the noise is keyed by the whole config: the two runs must agree on it
]


def _run(strategy, rounds: int = 2) -> list[np.ndarray]:
    config = strategy.config
    model = build_model_for_dataset(config.model.name, config.dataset.name, seed=0)
    result = strategy.start(InProcessGrid(nodes=2), ArrayRecord(get_weights(model)), num_rounds=rounds)
    return result.arrays.to_numpy_ndarrays()


def test_client_level_dp_around_fedsam_by_hand_is_hydras_dp_fedsam_bit_for_bit() -> None:
    config = compose_config(["strategy=dp_fedsam", *SMALL])
    from_hydra = build_strategy(config)
    by_hand = ClientLevelDP(FedSAM(config))
    assert type(from_hydra) is DPFedSAM and type(by_hand) is DPOverRounds
    hydra_model, hand_model = _run(from_hydra), _run(by_hand)
    for a, b in zip(hydra_model, hand_model, strict=True):
        np.testing.assert_array_equal(a, b)
    assert by_hand.epsilon() == from_hydra.epsilon() > 0
    assert by_hand.dp_guarantee() == from_hydra.dp_guarantee()
    p = config.privacy
    assert by_hand.epsilon() == pytest.approx(
        compute_epsilon(by_hand.account.accounted_noise_multiplier, p.sample_rate, 2, p.delta), rel=1e-12
    )


def test_the_layers_keywords_are_privacy_settings_and_equal_the_named_strategys() -> None:
    settings = {"num_clients": 20, "num_rounds": 2, "sample_rate": 0.2}
    privacy = {"clip_norm": 0.3, "noise_multiplier": 1.3, "delta": 1e-4, "accountant": "prv"}
    by_hand = ClientLevelDP(FedSAM(**settings), **privacy)
    named = DPFedSAM(**settings, **privacy)
    for key, value in privacy.items():
        assert getattr(by_hand.config.privacy, key) == getattr(named.config.privacy, key) == value
    assert by_hand.account.budget.projected_epsilon() == named.account.budget.projected_epsilon()
    assert by_hand.accountant.state_dict() == named.accountant.state_dict()


def test_the_wrapped_strategy_is_left_plain_and_the_layer_runs_a_private_rebuild() -> None:
    plain = FederatedAveraging(num_clients=20, num_rounds=2)
    layer = ClientLevelDP(plain, noise_multiplier=1.0)
    assert plain.privacy is None and plain.account is None and plain.noisy_average is None
    assert isinstance(layer.strategy, FederatedAveraging) and layer.strategy is not plain
    assert layer.strategy.privacy == PrivateRounds() and layer.account is not None
    assert layer.noisy_average is not None and layer.config.privacy.noise_multiplier == 1.0


def test_the_private_strategys_attributes_are_read_through_the_layer_and_never_shadowed_by_a_write() -> None:
    layer = DPFedSAM(num_clients=20, num_rounds=2)
    assert layer.noise_multiplier == layer.strategy.noise_multiplier  # read through the layer
    with pytest.raises(AttributeError, match=r"DPFedSAM\.noise_multiplier is the private strategy's"):
        layer.noise_multiplier = 2.0
    assert layer.strategy.noise_multiplier == layer.noise_multiplier != 2.0
    with pytest.raises(AttributeError, match="in_flight is the private strategy's"):
        ClientLevelDP(FederatedAveraging(num_clients=20)).in_flight = None
    layer.label = "mine"  # an attribute of the layer's own
    assert layer.label == "mine" and not hasattr(layer.strategy, "label")


def test_a_flower_accountant_accounts_the_layers_releases() -> None:
    accountant = RdpAccountant(privacy_config(1e-3, "poisson", 20))
    layer = ClientLevelDP(FederatedAveraging(num_clients=20, num_rounds=2), accountant=accountant, delta=1e-3)
    assert layer.accountant is accountant and layer.strategy.privacy == PrivateRounds(accountant)


def test_the_layer_is_chosen_by_the_strategy_it_wraps() -> None:
    flower = FedAdam(weighted_by_key=UNIT_WEIGHT, fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    wrapped = ClientLevelDP(flower, num_clients=2, sample_rate=0.5, clip_norm=1.0, noise_multiplier=1.0)
    assert type(wrapped) is DPOverFlowerMean and isinstance(wrapped, ClientLevelDP)
    assert isinstance(ClientLevelDP(FederatedAveraging(num_clients=20)), DPOverRounds)


def test_what_the_layer_cannot_wrap_is_refused_before_anything_runs() -> None:
    with pytest.raises(TypeError, match="ClientLevelDP wraps one of this project's plain strategies"):
        ClientLevelDP(object())
    with pytest.raises(ValueError, match="private by its own mechanism"):
        ClientLevelDP(NoisyFedAvg(num_clients=20))
    with pytest.raises(TypeError, match="clip_nrom not a privacy setting"):
        ClientLevelDP(FederatedAveraging(num_clients=20), clip_nrom=0.1)
    with pytest.raises(ConfigError, match=r"privacy\.noise_multiplier"):
        ClientLevelDP(FederatedAveraging(num_clients=20), noise_multiplier=-1.0)
    with pytest.raises(TypeError, match=r"pass checkpoint_dir to the wrapped strategy"):
        ClientLevelDP(FederatedAveraging(num_clients=20), checkpoint_dir="out")
    with pytest.raises(ValueError, match="client-level DP already"):
        ClientLevelDP(DPFedSAM(num_clients=20))
    # Rounds whose server releases the plain mean would release the clients' updates without noise.
    with pytest.raises(ValueError, match="server_average=False"):
        ClientLevelDP(FederatedAveraging(num_clients=20), private_rounds=PrivateRounds(server_average=False))
    with pytest.raises(ValueError, match="server_average=False"):
        FederatedAveraging(num_clients=20, privacy=PrivateRounds(server_average=False))


class WithItsOwnArgument(FederatedAveraging):
    def __init__(self, *args, my_lr: float = 0.1, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.my_lr = my_lr


def test_a_strategy_whose_constructor_the_rebuild_would_drop_is_refused() -> None:
    with pytest.raises(ValueError, match="constructor takes my_lr"):
        ClientLevelDP(WithItsOwnArgument(num_clients=20, my_lr=0.5))
    built = WithItsOwnArgument(num_clients=20, my_lr=0.5, privacy=PrivateRounds())  # what the message says to do
    assert built.my_lr == 0.5 and built.account is not None


def test_a_subclass_of_the_layer_names_the_kind_it_wraps() -> None:
    class Counting(ClientLevelDP):
        pass

    with pytest.raises(TypeError, match=r"subclass DPOverRounds .* or DPOverFlowerMean"):
        Counting(FederatedAveraging(num_clients=20))

    class CountingRounds(DPOverRounds):
        pass

    assert isinstance(CountingRounds(FederatedAveraging(num_clients=20)).strategy.privacy, PrivateRounds)
