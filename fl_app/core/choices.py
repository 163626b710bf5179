"""Every closed list of choices a setting can take, each defined once: a ``Literal`` type and, read from it with
``typing.get_args``, the tuple that config validation (fl_app/config/), the math (fl_app/privacy/) and the
command lines check against. This module is the lowest layer: it imports nothing of the project.
"""

from __future__ import annotations

from typing import Literal, get_args

#: ``privacy.sampling``: Poisson(q) or fixed-size m = qM without replacement (docs/mechanisms.md, 1), which the
#: sampled Gaussian accountants amplify; or a participation schema the server enforces (DP-FTRL, no amplification
#: assumed: fl_app/privacy/mechanisms/participation.py): ``cyclic`` groups (each client every b rounds) or
#: ``available`` (up to m of the clients available now that the rule still allows). ``auto`` (the config's default)
#: is the first sampler the strategy's accounting admits.
#: The samplers the sampled Gaussian accountants amplify, and those whose participation rule the server enforces.
AmplifiedSampling = Literal["poisson", "fixed"]
ParticipationSampling = Literal["cyclic", "available"]
Sampling = Literal[AmplifiedSampling, ParticipationSampling]
SAMPLINGS: tuple[str, ...] = get_args(AmplifiedSampling) + get_args(ParticipationSampling)
AMPLIFIED_SAMPLINGS: tuple[str, ...] = get_args(AmplifiedSampling)
PARTICIPATION_SAMPLINGS: tuple[str, ...] = get_args(ParticipationSampling)

#: ``strategy.factorization`` of DP-FTRL (fl_app/privacy/correlated_noise.py): BLT (buffered linear Toeplitz),
#: banded Toeplitz (BandMF's band structure), or the identity (independent noise every round: DP-FedAvg without
#: amplification).
FactorizationName = Literal["blt", "banded", "identity"]
FACTORIZATIONS: tuple[str, ...] = get_args(FactorizationName)

#: ``privacy.accountant``: Opacus RDP, Opacus PRV, dp_accounting PLD (fl_app/privacy/accountants/composition.py): the
#: methods that compose the sampled Gaussian mechanism (fl_app/privacy/accountants/sampled_gaussian.py).
AccountantName = Literal["rdp", "prv", "pld"]
ACCOUNTANTS: tuple[str, ...] = get_args(AccountantName)

#: The accountants fl_app/privacy/accountants/registry.py creates by name: the sampled Gaussian methods above, the
#: μ-GDP bound of Noisy-FedAvg/FedProx, and Flower's own RdpAccountant (``register_accountant`` adds more at run time).
RegisteredAccountant = Literal[AccountantName, "gdp", "flower-rdp"]
REGISTERED_ACCOUNTANTS: tuple[str, ...] = get_args(RegisteredAccountant)

#: ``privacy.placement``: where the round's noise is added (strategies/client_dp/placement.py): the server's
#: Gaussian, the clients' Gaussian shares, or the clients' Skellam shares under secure aggregation (distributed DP).
Placement = Literal["client", "server", "distributed"]
PLACEMENTS: tuple[str, ...] = get_args(Placement)

#: ``privacy.clipping``: a fixed C, or adaptive clipping's C_t (strategies/client_dp/clipping.py).
Clipping = Literal["fixed", "adaptive"]
CLIPPINGS: tuple[str, ...] = get_args(Clipping)

#: ``privacy.client_statistics``: what the run publishes about clients (strategies/statistics.py).
ClientStatisticsMode = Literal["auto", "raw", "noisy", "none"]
CLIENT_STATISTICS: tuple[str, ...] = get_args(ClientStatisticsMode)

#: ``privacy.noise_stream``: whose noise a seeded run draws. ``shared``: the (seed, round, purpose[, client]) streams
#: that every seeded run of the seed draws, whatever its strategy, C or σ (paired comparisons; but two such models,
#: published, cancel each other's noise); ``per_run``: those streams keyed also by the run's config
#: (fl_app/config/privacy.py ``noise_stream_key``).
NoiseStream = Literal["shared", "per_run"]
NOISE_STREAMS: tuple[str, ...] = get_args(NoiseStream)

#: ``audit.guess_rule``: the canary audit's one-run lower bound guesses "inserted" on the highest scores only
#: (one-sided), or also "not inserted" on the lowest (two-sided, the paper's symmetric rule)
#: (fl_app/privacy/audit/lower_bound.py ``one_run_lower_bound``).
GuessRule = Literal["one_sided", "two_sided"]
GUESS_RULES: tuple[str, ...] = get_args(GuessRule)

#: ``strategy.lr_schedule``: Noisy-FedAvg / Noisy-FedProx learning-rate schedules of seed 004's Thm 3.
NoisySchedule = Literal["constant", "cyclic", "stagewise", "continuous"]
NOISY_SCHEDULES: tuple[str, ...] = get_args(NoisySchedule)

#: The local optimizer of a client recipe.
LocalOptimizer = Literal["sgd", "sam"]
LOCAL_OPTIMIZERS: tuple[str, ...] = get_args(LocalOptimizer)

#: ``simulation.device``: where a worker (or the server's evaluation) runs; ``auto`` = CUDA when the machine has it.
Device = Literal["auto", "cpu", "cuda"]
DEVICES: tuple[str, ...] = get_args(Device)

#: How a worker trains a cohort message (``simulation.cohort_engine`` after ``auto``, which each worker resolves for
#: its own device: captured on a GPU, sequential on a CPU; ``captured`` is the vectorized step as a CUDA graph).
CohortEngine = Literal["sequential", "vectorized", "captured"]
COHORT_ENGINES: tuple[str, ...] = ("auto", *get_args(CohortEngine))

#: ``population``: clients as data partitions on any node (``virtual``), or one client per SuperNode (``nodes``).
PopulationMode = Literal["virtual", "nodes"]
POPULATIONS: tuple[str, ...] = get_args(PopulationMode)

#: ``server_optimizer.name``: the server's step along the released average (fl_app/server_optimizers.py).
ServerOptimizerName = Literal["sgd", "momentum", "adagrad", "adam", "yogi"]
SERVER_OPTIMIZERS: tuple[str, ...] = get_args(ServerOptimizerName)
#: ``server_optimizer.name`` too: the step taken by Flower's own strategy of that name (strategies/flower_step.py).
FlowerServerStepName = Literal[
    "flower_fedavg", "flower_fedavgm", "flower_fedadagrad", "flower_fedadam", "flower_fedyogi"
]
FLOWER_SERVER_STEPS: tuple[str, ...] = get_args(FlowerServerStepName)

#: ``model.name``: the model builders of fl_app/models.py (its ``MODELS`` registry has exactly these keys).
ModelName = Literal["cnn", "resnet18"]
MODEL_NAMES: tuple[str, ...] = get_args(ModelName)
