"""Loss landscape (Li et al. 2018 filter-normalised directions): the maths on a tiny model, and the CLI on a run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import strategies  # noqa: F401  (registers the strategy names the configs here are validated by)
from fl_app.landscape import (
    filter_normalized_direction,
    loss_surface_1d,
    loss_surface_2d,
    main,
    sharpness_summary,
    symmetric_grid,
)
from fl_app.models import evaluate

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _tiny() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    x = torch.randn(40, 1, 8, 8, generator=gen)
    y = torch.randint(0, 3, (40,), generator=gen)
    return model, x, y


def _snapshot(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_directions_are_filter_normalised_and_reproducible() -> None:
    model, _, _ = _tiny()
    d = filter_normalized_direction(model, torch.Generator().manual_seed(7))
    params = list(model.parameters())
    assert [t.shape for t in d] == [p.shape for p in params]
    for direction, w in zip(d, params, strict=True):
        if w.dim() <= 1:  # conv bias, GroupNorm weight/bias, linear bias
            assert torch.count_nonzero(direction) == 0
            continue
        for i in range(w.shape[0]):  # every filter: conv output channel, linear row
            assert direction[i].norm().item() == pytest.approx(w[i].detach().norm().item(), rel=1e-5)
        assert not torch.allclose(direction, w.detach())
    again = filter_normalized_direction(model, torch.Generator().manual_seed(7))
    assert all(torch.equal(a, b) for a, b in zip(d, again, strict=True))
    other = filter_normalized_direction(model, torch.Generator().manual_seed(8))
    assert not torch.equal(d[0], other[0])
    # Same result from the weights as arrays (what a loaded final_model.npz gives).
    from_arrays = filter_normalized_direction([p.detach().numpy() for p in params], torch.Generator().manual_seed(7))
    assert all(torch.equal(a, b) for a, b in zip(d, from_arrays, strict=True))


def test_symmetric_grid_has_exact_centre() -> None:
    grid = symmetric_grid(0.7, 21)
    assert grid[10] == 0.0 and grid[0] == -0.7 and grid[-1] == 0.7 and len(grid) == 21
    with pytest.raises(ValueError):
        symmetric_grid(1.0, 1)


def test_surfaces_centre_equals_evaluate_and_weights_are_restored() -> None:
    model, x, y = _tiny()
    before = _snapshot(model)
    loss0, acc0 = evaluate(model, x, y, CPU)
    gen = torch.Generator().manual_seed(0)
    d1 = filter_normalized_direction(model, gen)
    d2 = filter_normalized_direction(model, gen)
    alphas = symmetric_grid(1.0, 7)

    losses, accs = loss_surface_1d(model, d1, alphas, x, y, CPU)
    assert losses.shape == accs.shape == (7,)
    assert np.all(np.isfinite(losses)) and np.all((accs >= 0) & (accs <= 1))
    assert losses[3] == pytest.approx(loss0, abs=1e-6) and accs[3] == acc0
    assert losses.max() > loss0  # moving a whole filter-norm away from the weights costs loss
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

    grid, grid_acc = loss_surface_2d(model, (d1, d2), alphas, alphas[:5], x, y, CPU)
    assert grid.shape == grid_acc.shape == (7, 5)
    assert np.all(np.isfinite(grid))
    assert grid[3, 3] == pytest.approx(loss0, abs=1e-6)
    # b = 0 column is the 1-D curve along d1.
    np.testing.assert_allclose(grid[:, 3], losses, rtol=0, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert evaluate(model, x, y, CPU) == (loss0, acc0)


def test_weights_restored_even_on_error() -> None:
    model, x, y = _tiny()
    before = _snapshot(model)
    d = filter_normalized_direction(model, torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError):
        loss_surface_1d(model, d, [0.5], x[:, :, :4, :4], y, CPU)  # wrong input size fails inside the forward
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    with pytest.raises(ValueError, match="shape"):
        loss_surface_1d(model, d[::-1], [0.5], x, y, CPU)


def test_sharpness_summary() -> None:
    alphas = symmetric_grid(1.0, 5)
    losses = np.array([3.0, 1.5, 1.0, 1.5, 3.0])
    s = sharpness_summary(alphas, losses, np.full((5, 5), 2.0), 1.0, 0.9)
    assert s["max_increase_1d"] == 2.0 and s["mean_increase_1d"] == pytest.approx(1.0)
    assert s["curvature_1d"] == pytest.approx((1.5 - 2 + 1.5) / 0.25)
    assert s["max_increase_2d"] == 1.0 and s["center_accuracy"] == 0.9


def _fake_run(root: Path, strategy: str, seed: int) -> Path:
    """A finished-looking run directory: the app's config and a CNN (fresh init) as final_model.npz."""
    from fl_app.config import compose_config
    from fl_app.models import build_model_for_dataset, get_weights, weight_names

    config = compose_config([f"strategy={strategy}", f"seed={seed}", "num_rounds=1"])
    d = root / strategy
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"status": "completed", "config": config.to_dict()}))
    model = build_model_for_dataset(config.model.name, config.dataset.name, seed)
    np.savez(d / "final_model.npz", **dict(zip(weight_names(model), get_weights(model), strict=True)))
    return d


def test_cli_on_fabricated_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fl_app.data.datasets import FASHION_MNIST_SYSTEM_DIR, DatasetUnavailableError, load_dataset

    try:
        load_dataset("fashion_mnist")
    except DatasetUnavailableError:
        pytest.skip(f"Fashion-MNIST not installed ({FASHION_MNIST_SYSTEM_DIR})")
    runs = [_fake_run(tmp_path, "dp_fedavg", 0), _fake_run(tmp_path, "dp_fedsam", 1)]
    out = tmp_path / "out"
    args = [*map(str, runs), "--out", str(out), "--points", "5", "--samples", "100", "--device", "cpu"]
    assert main(args) == 0
    capsys.readouterr()
    for name in ("landscape_1d.png", "landscape_2d.png"):
        assert (out / name).stat().st_size > 1000
    data = np.load(out / "landscape.npz")
    assert list(data["labels"]) == ["dp_fedavg", "dp_fedsam"]
    assert data["losses_1d"].shape == (2, 5) and data["losses_2d"].shape == (2, 5, 5)
    assert np.all(np.isfinite(data["losses_2d"]))
    np.testing.assert_allclose(data["losses_1d"][:, 2], data["center_loss"], atol=1e-6)
    summary = json.loads((out / "landscape.json").read_text())
    assert [r["strategy"] for r in summary["runs"]] == ["dp_fedavg", "dp_fedsam"]
    assert summary["runs"][0]["center_loss"] == pytest.approx(float(data["center_loss"][0]))
    # Same seed, same surfaces; the default output directory is <first run>/landscape.
    assert main([str(runs[0]), "--points", "3", "--samples", "50", "--device", "cpu", "--no-2d"]) == 0
    assert (
        main([str(runs[0]), "--points", "3", "--samples", "50", "--device", "cpu", "--no-2d", "--out", str(out)]) == 0
    )
    first = np.load(runs[0] / "landscape" / "landscape.npz")["losses_1d"]
    np.testing.assert_array_equal(first, np.load(out / "landscape.npz")["losses_1d"])
    assert main([str(tmp_path / "nope")]) == 1
    with pytest.raises(SystemExit):
        main([str(runs[0]), "--points", "4"])
