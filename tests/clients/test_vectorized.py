"""Tests for clients/vectorized.py: a whole cohort trained at once on stacked model copies (torch.func) must give,
client by client, what the per-client loops of clients/training.py give from a generator of the same seed.

Clients have unequal sizes (0, 5, 13, 32, 47 samples with B = 8): short last batches, different step counts, a
``max_steps`` cap that binds for one client only, and an empty client. They are passed smallest first, so the
engine's longest-first stacking really reorders them. Each reference is :func:`train_local` /
:func:`train_local_noisy` on a fresh copy of the same starting model. Weights must agree to 1e-5 (max abs), loss
to 1e-5 relative, step and example counts and accuracy exactly.

The paper CNN (ReLU, max-pool) runs in float64. In float32 the two paths round differently (batched grouped
convolutions vs one client's), and over a few steps a pre-activation within rounding of a ReLU or max-pool kink
eventually lands on different sides in the two paths: its gradient jumps by O(1e-3) and the weights part by
1e-4…1e-2 (seen with SAM + BLUR after 4 steps; in float64 the same run agrees to 1e-16). That is a property of
float32 ReLU networks, not of the engine, so the CNN comparisons use float64 (and a tolerance of 1e-10) while the
small GroupNorm model (checked over 25 seeds: ≤ 5e-7) exercises the float32 path.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence

import pytest
import torch
from torch import nn

from clients.noisy_training import train_local_noisy
from clients.regularizers import blur_term, make_blur_loss
from clients.training import (
    LocalTrainingConfig,
    LocalTrainingResult,
    NoisyLocalConfig,
    train_local,
)
from clients.vectorized import (
    StackedRegularizer,
    batch_schedule,
    check_vectorizable,
    noisy_batch_schedule,
    train_stacked,
    train_stacked_noisy,
)
from fl_app.models import CNN

CPU = torch.device("cpu")
ATOL = 1e-5
ATOL64 = 1e-10  # float64 runs
SIZES = (0, 5, 13, 32, 47)
# With B = 8: ⌈n/8⌉ = 0, 1, 2, 4, 6 steps per epoch; 2 epochs give 0, 2, 4, 8, 12 steps, capped at 9 for n = 47.
BASE = LocalTrainingConfig(epochs=2, batch_size=8, lr=0.1, momentum=0.5, weight_decay=5e-3, lr_decay=0.9, max_steps=9)
SERVER_ROUND = 3  # η_t = 0.1 · 0.9² : the decay is applied
OPTIMIZERS = {
    "sgd": {"optimizer": "sgd"},
    "sam": {"optimizer": "sam", "rho": 0.05, "adaptive": False},
    "asam": {"optimizer": "sam", "rho": 0.5, "adaptive": True},
}

Data = list[tuple[torch.Tensor, torch.Tensor]]
Params = dict[str, torch.Tensor]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: the per-client and stacked paths then reduce in a fixed order on every machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ----- models, data, references ---------------------------------------------------------------------------------------


def _small_model(seed: int = 0, classes: int = 3) -> nn.Module:
    # Layer constructors draw their init from the global RNG; fork it so the tests leave it as found.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(
            nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, classes)
        )


def _linear_model(seed: int = 0) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 3))


def _cnn(seed: int = 0) -> nn.Module:
    """The paper CNN in float64 (see the module docstring)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return CNN().double()


def _data(
    sizes: Sequence[int],
    shape: tuple[int, ...] = (1, 8, 8),
    classes: int = 3,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Data:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, *shape, generator=gen).to(dtype), torch.randint(0, classes, (n,), generator=gen)) for n in sizes
    ]


def _images(sizes: Sequence[int], seed: int) -> Data:
    """28×28 float64 inputs for the paper CNN, 10 classes."""
    return _data(sizes, (1, 28, 28), 10, seed, torch.float64)


def _seeds(count: int) -> list[int]:
    return [100 + 7 * i for i in range(count)]


def _gens(seeds: Sequence[int]) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


def _params(model: nn.Module) -> Params:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _blur_regularizer(clip_norm: float, coef: float) -> StackedRegularizer:
    """The BLUR term exactly as clients/cohort.py hands it to the engine."""

    def regularizer(params: Params, reference: Params) -> torch.Tensor:
        return blur_term([params[n] for n in reference], list(reference.values()), clip_norm, coef)

    return regularizer


def _reference(
    model: nn.Module,
    data: Data,
    config: LocalTrainingConfig,
    seeds: Sequence[int],
    blur: tuple[float, float] | None = None,
    server_round: int = SERVER_ROUND,
) -> list[tuple[Params, LocalTrainingResult]]:
    out = []
    for (x, y), seed in zip(data, seeds, strict=True):
        local = copy.deepcopy(model)
        extra = make_blur_loss(local, *blur) if blur is not None else None
        result = train_local(
            local, x, y, config, server_round, torch.Generator().manual_seed(seed), CPU, extra_loss=extra
        )
        out.append((_params(local), result))
    return out


def _reference_noisy(
    model: nn.Module, data: Data, config: NoisyLocalConfig, seeds: Sequence[int], server_round: int = SERVER_ROUND
) -> list[tuple[Params, LocalTrainingResult]]:
    out = []
    for (x, y), seed in zip(data, seeds, strict=True):
        local = copy.deepcopy(model)
        result = train_local_noisy(local, x, y, config, server_round, torch.Generator().manual_seed(seed), CPU)
        out.append((_params(local), result))
    return out


def _max_diff(a: Params, b: Params) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _assert_result_equal(got: LocalTrainingResult, want: LocalTrainingResult, who: str) -> None:
    assert got.diverged == want.diverged, who
    assert got.num_steps == want.num_steps, who
    assert got.num_examples == want.num_examples, who
    assert got.accuracy == want.accuracy, who
    if want.diverged:
        assert math.isnan(got.loss), who
    else:
        assert math.isclose(got.loss, want.loss, rel_tol=1e-5, abs_tol=1e-7), (who, got.loss, want.loss)


def _assert_matches(
    finals: list[Params],
    results: list[LocalTrainingResult],
    reference: list[tuple[Params, LocalTrainingResult]],
    atol: float = ATOL,
) -> None:
    assert len(finals) == len(results) == len(reference)
    for i, (final, result, (want_params, want)) in enumerate(zip(finals, results, reference, strict=True)):
        assert all(final[k].dtype == want_params[k].dtype for k in want_params)
        diff = _max_diff(final, want_params)
        assert diff <= atol, f"client {i}: weights differ by {diff:.3g}"
        _assert_result_equal(result, want, f"client {i}")


def _assert_trained(start: nn.Module, finals: list[Params], data: Data) -> None:
    """Sanity: every non-empty client moved away from the start (else matching the reference proves nothing)."""
    origin = _params(start)
    for final, (x, _) in zip(finals, data, strict=True):
        moved = _max_diff(final, origin)
        assert moved == 0.0 if len(x) == 0 else moved > 1e-4


# ----- train_stacked vs train_local -----------------------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_stacked_matches_train_local_small_model(optimizer: str) -> None:
    config = dataclasses.replace(BASE, **OPTIMIZERS[optimizer])  # type: ignore[arg-type]
    model, data, seeds = _small_model(), _data(SIZES), _seeds(len(SIZES))
    finals, results = train_stacked(model, data, config, SERVER_ROUND, _gens(seeds), CPU)
    reference = _reference(model, data, config, seeds)
    _assert_matches(finals, results, reference)
    _assert_trained(model, finals, data)
    # The cohort is really unequal: 0, 2, 4, 8 and 9 (capped from 12) steps.
    assert [r.num_steps for r in results] == [0, 2, 4, 8, 9]
    assert [r.num_examples for r in results] == list(SIZES)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_stacked_matches_train_local_paper_cnn(optimizer: str) -> None:
    config = dataclasses.replace(BASE, epochs=2, max_steps=None, **OPTIMIZERS[optimizer])  # type: ignore[arg-type]
    sizes = (3, 0, 17, 9)
    model, data, seeds = _cnn(), _images(sizes, seed=1), _seeds(len(sizes))
    finals, results = train_stacked(model, data, config, SERVER_ROUND, _gens(seeds), CPU)
    _assert_matches(finals, results, _reference(model, data, config, seeds), atol=ATOL64)
    _assert_trained(model, finals, data)
    assert [r.num_steps for r in results] == [2, 0, 6, 4]


@pytest.mark.parametrize("optimizer", ["sgd", "sam", "asam"])
def test_stacked_blur_matches_train_local_with_blur_loss(optimizer: str) -> None:
    config = dataclasses.replace(BASE, **OPTIMIZERS[optimizer])  # type: ignore[arg-type]
    clip_norm, coef = 0.05, 5.0
    model, data, seeds = _small_model(), _data(SIZES), _seeds(len(SIZES))
    finals, results = train_stacked(
        model, data, config, SERVER_ROUND, _gens(seeds), CPU, regularizer=_blur_regularizer(clip_norm, coef)
    )
    reference = _reference(model, data, config, seeds, blur=(clip_norm, coef))
    _assert_matches(finals, results, reference)
    # The term is active: without it the larger clients end elsewhere, and BLUR pulls them towards the ball.
    plain = _reference(model, data, config, seeds)
    origin = _params(model)
    for i in (3, 4):
        assert _max_diff(reference[i][0], plain[i][0]) > 1e-3

        def drift(p: Params) -> float:
            return float(torch.linalg.vector_norm(torch.cat([(p[k] - origin[k]).flatten() for k in p])))

        assert drift(reference[i][0]) < drift(plain[i][0])


def test_stacked_blur_on_paper_cnn() -> None:
    config = dataclasses.replace(BASE, max_steps=None, **OPTIMIZERS["sam"])  # type: ignore[arg-type]
    sizes, clip_norm, coef = (9, 17), 0.02, 5.0
    model, data, seeds = _cnn(), _images(sizes, seed=2), _seeds(len(sizes))
    finals, results = train_stacked(
        model, data, config, SERVER_ROUND, _gens(seeds), CPU, regularizer=_blur_regularizer(clip_norm, coef)
    )
    reference = _reference(model, data, config, seeds, blur=(clip_norm, coef))
    _assert_matches(finals, results, reference, atol=ATOL64)
    plain = _reference(model, data, config, seeds)
    assert _max_diff(reference[1][0], plain[1][0]) > 1e-4


def test_stacked_round_one_and_no_momentum_no_weight_decay() -> None:
    config = dataclasses.replace(BASE, momentum=0.0, weight_decay=0.0, max_steps=None, epochs=1)
    model, data, seeds = _small_model(1), _data(SIZES, seed=3), _seeds(len(SIZES))
    finals, results = train_stacked(model, data, config, 1, _gens(seeds), CPU)
    _assert_matches(finals, results, _reference(model, data, config, seeds, server_round=1))


def test_stacked_result_does_not_depend_on_the_other_clients() -> None:
    """A client alone, or in a different cohort order, gets the same weights (no cross-talk through the stack)."""
    model, data, seeds = _small_model(), _data(SIZES), _seeds(len(SIZES))
    config = dataclasses.replace(BASE, **OPTIMIZERS["sam"])  # type: ignore[arg-type]
    finals, results = train_stacked(model, data, config, SERVER_ROUND, _gens(seeds), CPU)
    perm = [3, 0, 4, 1, 2]
    finals_p, results_p = train_stacked(
        model, [data[i] for i in perm], config, SERVER_ROUND, _gens([seeds[i] for i in perm]), CPU
    )
    for j, i in enumerate(perm):
        assert _max_diff(finals_p[j], finals[i]) <= ATOL
        _assert_result_equal(results_p[j], results[i], f"client {i}")
    alone, alone_results = train_stacked(model, data[2:3], config, SERVER_ROUND, _gens(seeds[2:3]), CPU)
    assert _max_diff(alone[0], finals[2]) <= ATOL
    _assert_result_equal(alone_results[0], results[2], "client 2 alone")


# ----- train_stacked_noisy vs train_local_noisy -----------------------------------------------------------------------


NOISY_SIZES = (0, 5, 13, 32)  # n = 5 < B: minibatches of b = min(B, n) = 5


@pytest.mark.parametrize(
    ("schedule", "prox_coef"), [("cyclic", 0.0), ("continuous", 2.0), ("stagewise", 0.5), ("constant", 3.0)]
)
def test_stacked_noisy_matches_train_local_noisy(schedule: str, prox_coef: float) -> None:
    config = NoisyLocalConfig(
        steps=6,
        batch_size=8,
        lr=0.2,
        schedule=schedule,
        grad_clip=0.3,
        prox_coef=prox_coef,  # type: ignore[arg-type]
    )
    model, data, seeds = _small_model(), _data(NOISY_SIZES, seed=4), _seeds(len(NOISY_SIZES))
    finals, results = train_stacked_noisy(model, data, config, SERVER_ROUND, _gens(seeds), CPU)
    reference = _reference_noisy(model, data, config, seeds)
    _assert_matches(finals, results, reference)
    _assert_trained(model, finals, data)
    assert [r.num_steps for r in results] == [0, 6, 6, 6]
    # The clip to V binds: with a bound that never binds the clients end elsewhere.
    loose = dataclasses.replace(config, grad_clip=1e6)
    unclipped = _reference_noisy(model, data, loose, seeds)
    assert max(_max_diff(reference[i][0], unclipped[i][0]) for i in (1, 2, 3)) > 1e-3


def test_stacked_noisy_paper_cnn() -> None:
    config = NoisyLocalConfig(steps=4, batch_size=8, lr=0.1, schedule="cyclic", grad_clip=0.5, prox_coef=1.0)
    sizes = (6, 0, 17)
    model, data, seeds = _cnn(), _images(sizes, seed=5), _seeds(len(sizes))
    finals, results = train_stacked_noisy(model, data, config, 2, _gens(seeds), CPU)
    _assert_matches(finals, results, _reference_noisy(model, data, config, seeds, server_round=2), atol=ATOL64)
    _assert_trained(model, finals, data)


def test_stacked_noisy_rejects_round_zero() -> None:
    config = NoisyLocalConfig(steps=2, batch_size=8, lr=0.1, schedule="constant", grad_clip=1.0)
    with pytest.raises(ValueError, match="server_round"):
        train_stacked_noisy(_small_model(), _data((5,)), config, 0, _gens([1]), CPU)


# ----- divergence -----------------------------------------------------------------------------------------------------


def _poison(data: Data, client: int, transform: Callable[[torch.Tensor], torch.Tensor]) -> Data:
    out = list(data)
    x, y = out[client]
    out[client] = (transform(x.clone()), y)
    return out


def _with_inf_sample(x: torch.Tensor) -> torch.Tensor:
    x[20, 0, 3, 3] = math.inf  # met in some batch after a few steps, not in the first one (checked below)
    return x


@pytest.mark.parametrize("optimizer", ["sgd", "sam"])
def test_diverging_client_is_reported_alone(optimizer: str) -> None:
    config = dataclasses.replace(BASE, **OPTIMIZERS[optimizer])  # type: ignore[arg-type]
    model, seeds = _small_model(), _seeds(len(SIZES))
    data = _poison(_data(SIZES), 3, _with_inf_sample)
    finals, results = train_stacked(model, data, config, SERVER_ROUND, _gens(seeds), CPU)
    reference = _reference(model, data, config, seeds)
    assert [r.diverged for r in results] == [False, False, False, True, False]
    assert reference[3][1].diverged and 0 < reference[3][1].num_steps < 8  # stopped mid-training
    # Same steps taken as the per-client loop, and the same last finite weights.
    _assert_matches(finals, results, reference)
    assert all(torch.isfinite(t).all() for t in finals[3].values())
    # The others are exactly what they get in a cohort without the diverging client.
    keep = [0, 1, 2, 4]
    without, without_results = train_stacked(
        model, [data[i] for i in keep], config, SERVER_ROUND, _gens([seeds[i] for i in keep]), CPU
    )
    for j, i in enumerate(keep):
        assert _max_diff(finals[i], without[j]) <= ATOL
        _assert_result_equal(results[i], without_results[j], f"client {i}")


def test_client_whose_weights_blow_up_later_diverges_alone() -> None:
    """Huge but finite inputs: the first step is finite, the next overflows; the stop is at the same step."""
    model, seeds = _linear_model(), _seeds(4)
    data = _poison(_data((5, 13, 32, 47), seed=6), 2, lambda x: x * 1e30)
    config = dataclasses.replace(BASE, max_steps=None)
    finals, results = train_stacked(model, data, config, SERVER_ROUND, _gens(seeds), CPU)
    reference = _reference(model, data, config, seeds)
    assert [r.diverged for r in results] == [False, False, True, False]
    assert reference[2][1].num_steps >= 1
    _assert_matches(finals, results, reference)


class _SqrtAbs(nn.Module):
    """√|a|: finite forward everywhere, but an infinite derivative at a = 0."""

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return a.abs().sqrt()


def test_weights_that_turn_non_finite_on_a_finite_step_count_as_diverged() -> None:
    """All-zero images through a bias-free layer into √|·|: the loss is finite, the gradient NaN (∞ · 0), so the
    client's only step leaves NaN weights; like train_local, the engine must report it diverged (not a success)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(64, 8, bias=False), _SqrtAbs(), nn.Linear(8, 3))
    data = _data((5, 8, 13), seed=8)
    data[1] = (torch.zeros_like(data[1][0]), data[1][1])
    config = dataclasses.replace(BASE, epochs=1, max_steps=None)  # 1, 1 and 2 steps
    seeds = _seeds(3)
    finals, results = train_stacked(model, data, config, SERVER_ROUND, _gens(seeds), CPU)
    reference = _reference(model, data, config, seeds)
    assert reference[1][1].diverged and reference[1][1].num_steps == 1
    assert not all(torch.isfinite(t).all() for t in reference[1][0].values())
    assert [r.diverged for r in results] == [False, True, False]
    for i in range(3):
        _assert_result_equal(results[i], reference[i][1], f"client {i}")
        for name, want in reference[i][0].items():
            assert torch.allclose(finals[i][name], want, rtol=0, atol=ATOL, equal_nan=True), (i, name)


def test_noisy_diverging_client_is_reported_alone() -> None:
    config = NoisyLocalConfig(steps=6, batch_size=8, lr=0.2, schedule="cyclic", grad_clip=0.3, prox_coef=1.0)
    model, seeds = _small_model(), _seeds(4)
    data = _poison(_data((5, 13, 32, 47), seed=7), 2, _with_inf_sample)
    finals, results = train_stacked_noisy(model, data, config, SERVER_ROUND, _gens(seeds), CPU)
    reference = _reference_noisy(model, data, config, seeds)
    assert [r.diverged for r in results] == [False, False, True, False]
    assert 0 < reference[2][1].num_steps < 6
    _assert_matches(finals, results, reference)
    keep = [0, 1, 3]
    without, without_results = train_stacked_noisy(
        model, [data[i] for i in keep], config, SERVER_ROUND, _gens([seeds[i] for i in keep]), CPU
    )
    for j, i in enumerate(keep):
        assert _max_diff(finals[i], without[j]) <= ATOL
        _assert_result_equal(results[i], without_results[j], f"client {i}")


# ----- model checks, inputs, side effects -----------------------------------------------------------------------------


def test_batchnorm_model_is_rejected() -> None:
    with torch.random.fork_rng(devices=[]):
        bn = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(72, 3))
    with pytest.raises(ValueError, match="buffers"):
        check_vectorizable(bn)
    with pytest.raises(ValueError, match="buffers"):
        train_stacked(bn, _data((5,)), BASE, 1, _gens([1]), CPU)
    noisy = NoisyLocalConfig(steps=2, batch_size=8, lr=0.1, schedule="constant", grad_clip=1.0)
    with pytest.raises(ValueError, match="buffers"):
        train_stacked_noisy(bn, _data((5,)), noisy, 1, _gens([1]), CPU)
    check_vectorizable(_small_model())  # GroupNorm has no buffers
    check_vectorizable(_cnn())


def test_input_validation_and_empty_cohort() -> None:
    model = _small_model()
    with pytest.raises(ValueError, match="generators"):
        train_stacked(model, _data((5, 6)), BASE, 1, _gens([1]), CPU)
    x, y = _data((5,))[0]
    with pytest.raises(ValueError, match="samples"):
        train_stacked(model, [(x, y[:4])], BASE, 1, _gens([1]), CPU)
    assert train_stacked(model, [], BASE, 1, [], CPU) == ([], [])
    noisy = NoisyLocalConfig(steps=2, batch_size=8, lr=0.1, schedule="constant", grad_clip=1.0)
    assert train_stacked_noisy(model, [], noisy, 1, [], CPU) == ([], [])
    finals, results = train_stacked(model, _data((0, 0)), BASE, 1, _gens([1, 2]), CPU)
    assert [r.num_steps for r in results] == [0, 0] and _max_diff(finals[0], _params(model)) == 0.0


@pytest.mark.parametrize("training", [True, False])
def test_model_passed_in_is_not_modified(training: bool) -> None:
    model = _small_model().train(training)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    data, seeds = _data(SIZES), _seeds(len(SIZES))
    config = dataclasses.replace(BASE, **OPTIMIZERS["asam"])  # type: ignore[arg-type]
    train_stacked(model, data, config, SERVER_ROUND, _gens(seeds), CPU, regularizer=_blur_regularizer(0.05, 5.0))
    noisy = NoisyLocalConfig(steps=3, batch_size=8, lr=0.2, schedule="cyclic", grad_clip=0.3, prox_coef=1.0)
    train_stacked_noisy(model, data, noisy, SERVER_ROUND, _gens(seeds), CPU)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())
    assert model.training is training


def test_returned_tensors_do_not_alias_each_other_or_the_model() -> None:
    model = _small_model()
    finals, _ = train_stacked(model, _data((5, 13)), BASE, 1, _gens([1, 2]), CPU)
    finals[0]["1.weight"].add_(1.0)
    assert _max_diff(finals[1], _params(model)) < 1.0
    assert not torch.equal(finals[0]["1.weight"], finals[1]["1.weight"])


# ----- mini-batch schedules -------------------------------------------------------------------------------------------


def test_batch_schedule_replays_the_per_epoch_permutations() -> None:
    n, config = 13, dataclasses.replace(BASE, epochs=3, batch_size=8, max_steps=5)
    schedule = batch_schedule(n, config, torch.Generator().manual_seed(42))
    gen = torch.Generator().manual_seed(42)
    perms = [torch.randperm(n, generator=gen) for _ in range(3)]
    expected = [perms[0][:8], perms[0][8:], perms[1][:8], perms[1][8:], perms[2][:8]]
    assert len(schedule) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(schedule, expected, strict=True))
    # Without a cap: E · ⌈n/B⌉ batches, every epoch a permutation of all samples.
    full = batch_schedule(n, dataclasses.replace(config, max_steps=None), torch.Generator().manual_seed(42))
    assert len(full) == 6
    for epoch in range(3):
        assert torch.equal(torch.cat(full[2 * epoch : 2 * epoch + 2]), perms[epoch])
    assert batch_schedule(0, config, torch.Generator().manual_seed(42)) == []


def test_batch_schedule_is_what_train_local_draws() -> None:
    """The generator is left where train_local leaves it (it drew the same permutations, nothing more)."""
    n, config = 13, dataclasses.replace(BASE, epochs=3, max_steps=5)
    x, y = _data((n,))[0]
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    batch_schedule(n, config, g1)
    train_local(_small_model(), x, y, config, 1, g2, CPU)
    assert torch.equal(g1.get_state(), g2.get_state())


def test_noisy_batch_schedule_replays_the_permutations() -> None:
    config = NoisyLocalConfig(steps=5, batch_size=8, lr=0.1, schedule="constant", grad_clip=1.0)
    gen = torch.Generator().manual_seed(3)
    # n = 13, b = 8: a fresh permutation whenever fewer than 8 indices are left, i.e. every step.
    perms = [torch.randperm(13, generator=gen) for _ in range(5)]
    schedule = noisy_batch_schedule(13, config, torch.Generator().manual_seed(3))
    assert all(torch.equal(a, p[:8]) for a, p in zip(schedule, perms, strict=True))
    # n = 20, b = 8: two batches per permutation, the last 4 indices dropped.
    gen = torch.Generator().manual_seed(3)
    perms = [torch.randperm(20, generator=gen) for _ in range(3)]
    schedule = noisy_batch_schedule(20, config, torch.Generator().manual_seed(3))
    expected = [perms[0][:8], perms[0][8:16], perms[1][:8], perms[1][8:16], perms[2][:8]]
    assert all(torch.equal(a, b) for a, b in zip(schedule, expected, strict=True))
    # n = 5 < B: b = n, each batch a whole fresh permutation.
    gen = torch.Generator().manual_seed(3)
    perms = [torch.randperm(5, generator=gen) for _ in range(5)]
    schedule = noisy_batch_schedule(5, config, torch.Generator().manual_seed(3))
    assert all(torch.equal(a, p) for a, p in zip(schedule, perms, strict=True))
    assert noisy_batch_schedule(0, config, torch.Generator().manual_seed(3)) == []


def test_noisy_batch_schedule_is_what_train_local_noisy_draws() -> None:
    config = NoisyLocalConfig(steps=7, batch_size=8, lr=0.1, schedule="constant", grad_clip=1.0)
    for n in (5, 13, 20):
        x, y = _data((n,))[0]
        g1, g2 = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
        noisy_batch_schedule(n, config, g1)
        train_local_noisy(_small_model(), x, y, config, 1, g2, CPU)
        assert torch.equal(g1.get_state(), g2.get_state()), n
