"""The stateful accountant of one training run: its (σ, q, rounds) history, ε so far and the budget guard
(``would_exceed``, docs/mechanisms.md, 7), with a JSON-serialisable state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fl_app.core.choices import AccountantName, Sampling
from fl_app.privacy.accountants.checks import Segment, _check_config, _check_segment, fixed_sample_size
from fl_app.privacy.accountants.composition import epsilon_from_history

# ------------------------------------------------------------------------------------------------------------
# Stateful accountant with budget guard
# ------------------------------------------------------------------------------------------------------------


class CompositionHistory:
    """Running accountant over the rounds of one training run, in the style of Opacus' accountants.

    Keeps the history as (σ, q, rounds) segments, merging consecutive rounds with equal (σ, q), and recomputes
    ε from the whole history, so rounds with different σ or q compose correctly. ``would_exceed`` is the
    budget guard (docs/mechanisms.md, 7): the server asks it before each round and stops if that round would exceed
    ``max_epsilon``.
    """

    def __init__(
        self,
        accountant: AccountantName = "rdp",
        sampling: Sampling = "poisson",
        population: int | None = None,
    ) -> None:
        _check_config(accountant, sampling, population)
        self.accountant: AccountantName = accountant
        self.sampling: Sampling = sampling
        self.population: int | None = None if population is None else int(population)
        self._history: list[Segment] = []

    @property
    def steps(self) -> int:
        """Number of accounted rounds."""
        return sum(steps for _, _, steps in self._history)

    @property
    def history(self) -> list[Segment]:
        """A copy of the (σ, q, rounds) segments."""
        return list(self._history)

    def step(self, noise_multiplier: float, sample_rate: float, num_steps: int = 1) -> None:
        """Record ``num_steps`` rounds with noise multiplier σ and sampling rate q."""
        _check_segment(noise_multiplier, sample_rate, num_steps)
        if self.sampling == "fixed":
            assert self.population is not None
            # Fail when the round is recorded, not later when someone asks for ε.
            fixed_sample_size(sample_rate, self.population)
        if num_steps == 0:
            return
        noise_multiplier, sample_rate = float(noise_multiplier), float(sample_rate)
        if self._history and self._history[-1][:2] == (noise_multiplier, sample_rate):
            self._history[-1] = (noise_multiplier, sample_rate, self._history[-1][2] + int(num_steps))
        else:
            self._history.append((noise_multiplier, sample_rate, int(num_steps)))

    def get_epsilon(self, delta: float) -> float:
        """ε(δ) spent so far (0 before the first round)."""
        return epsilon_from_history(self._history, delta, self.accountant, self.sampling, self.population)

    def epsilon_after(self, extra_steps: int, noise_multiplier: float, sample_rate: float, delta: float) -> float:
        """ε(δ) if ``extra_steps`` more rounds with (σ, q) were run; the accountant itself is not changed."""
        _check_segment(noise_multiplier, sample_rate, extra_steps)
        extended = [*self._history, (float(noise_multiplier), float(sample_rate), int(extra_steps))]
        return epsilon_from_history(extended, delta, self.accountant, self.sampling, self.population)

    def would_exceed(self, max_epsilon: float, delta: float, noise_multiplier: float, sample_rate: float) -> bool:
        """True if running one more round with (σ, q) would take ε(δ) above ``max_epsilon``."""
        return self.epsilon_after(1, noise_multiplier, sample_rate, delta) > max_epsilon

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the configuration and the history as lists."""
        return {
            "accountant": self.accountant,
            "sampling": self.sampling,
            "population": self.population,
            "history": [[sigma, rate, steps] for sigma, rate, steps in self._history],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the history saved by ``state_dict``; the configuration must match this accountant's."""
        for key in ("accountant", "sampling", "population", "history"):
            if key not in state:
                raise ValueError(f"accountant state has no {key!r} entry")
        saved = (state["accountant"], state["sampling"], state["population"])
        if saved != (self.accountant, self.sampling, self.population):
            raise ValueError(
                f"accountant state was saved for (accountant, sampling, population) = {saved}, "
                f"not {(self.accountant, self.sampling, self.population)}"
            )
        history: list[Segment] = []
        for entry in state["history"]:
            sigma, rate, steps = entry
            _check_segment(float(sigma), float(rate), int(steps))
            history.append((float(sigma), float(rate), int(steps)))
        self._history = history

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> CompositionHistory:
        """A new accountant with the configuration and history of ``state``."""
        restored = cls(state["accountant"], state["sampling"], state["population"])
        restored.load_state_dict(state)
        return restored
