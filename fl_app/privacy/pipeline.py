"""The privacy pipeline: mechanisms as objects, each with a client step and a server step.

A round's privacy is a short composition of mechanisms (a *recipe*). Every client runs the client steps on its own
update Δ, **in list order**; the server runs the server steps on the fixed-denominator average of the admitted
updates, **in list order** (pfl-research's postprocessors are the model: ``postprocess_one_user`` then
``postprocess_server``). The math is :mod:`fl_app.privacy.mechanisms`' pure functions; an object only says where
in the round it applies them. The recipes, in the order their steps run (journal Alg. 1 lines 10–12, Eqs. 10–12;
docs/mechanisms.md, 2–4; docs/algorithms.md):

* ``dense`` — DP-FedAvg / DP-FedSAM / DP-FedAvg-blur: :class:`Clip` → :class:`GaussianNoise`.
* ``topk_noisy`` / ``topk_clean`` — DP-FedSAM-topk with client masks: ``dense``, then :class:`TopKOfNoisy` /
  :class:`TopKOfClipped`.
* ``shared_mask`` — Fed-SMP with the round's public mask: :class:`SharedMask` → :class:`Clip` →
  :class:`GaussianNoise` → :class:`NoiseOnSupport`.
* ``topk_local`` — Fed-SMP-topk as published: :class:`LocalTopK` → :class:`Clip` → :class:`GaussianNoise` →
  :class:`NoiseOnSupport`.
* ``lus`` — BLUR + LUS: :class:`LocalTopK` → :class:`Clip` → :class:`GaussianNoise` (dense noise).
* ``noisy_model`` — Noisy-FedAvg / Noisy-FedProx: :class:`AbsoluteNoise` (no update clip; the server takes the
  plain mean).
* ``clip`` — DP-FTRL: :class:`Clip` only; the server's correlated noise
  (:class:`fl_app.privacy.correlated_noise.CorrelatedNoise`) follows as a server-only mechanism.

Where the Gaussian noise goes (``privacy.placement``) is the server's
:class:`~strategies.client_dp.placement.Placement`: it sets the clients' share (:attr:`ClientStep.noise_std`, None in
server placement) and the server's (:attr:`ServerStep.noise_std`). A new mechanism is one :class:`Mechanism` subclass; a
new recipe is one :func:`register_recipe` call naming its steps (the kind travels on the wire, both sides build the same
steps).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fl_app.privacy import mechanisms as mech
from fl_app.privacy.accountants.events import GDPEvent, SampledGaussianEvent
from fl_app.privacy.accountants.skellam import SkellamEvent

NDArrays = list[np.ndarray]


@dataclass
class ClientStep:
    """What one client's steps share while they run on its update."""

    #: C (0 = no update clipping: the non-private references).
    clip_norm: float
    #: The client's own Gaussian noise std (client placement: σC/√m); None when the server adds the noise.
    noise_std: float | None
    #: The client's noise source (:func:`fl_app.privacy.mechanisms.random_source`).
    rng: mech.NormalSource
    #: The round's public shared mask from the server (Fed-SMP), if any.
    shared_mask: Sequence[np.ndarray] | None = None
    #: The support chosen before clipping (a shared or local mask), for the steps after the noise.
    mask: NDArrays | None = None
    #: The clipped update, before any noise.
    clipped: NDArrays | None = None
    #: ‖Δ‖₂ of what was clipped, before clipping (the reply's ``pre_clip_norm``).
    pre_clip_norm: float = math.nan
    #: Whether the client added Gaussian noise.
    noised: bool = False


@dataclass
class ServerStep:
    """What the server's steps share while they run on the round's average."""

    #: The std of the Gaussian noise the server adds to the average (the placement's share).
    noise_std: float
    #: The server's noise source for the round.
    rng: mech.NormalSource
    #: The round's public shared mask, if any.
    mask: Sequence[np.ndarray] | None = None
    #: The admitted updates (or cohort sums of them) the average was taken over.
    updates: list[NDArrays] = field(default_factory=list)


@dataclass(frozen=True)
class ReleaseParameters:
    """What a release's privacy event needs beyond the mechanism: the noise multiplier the accountant composes (the
    joint one when a noisy count is released with the update: Andrew et al. 2021, Thm. 1) and the sampling rate q."""

    noise_multiplier: float
    sample_rate: float


#: An event a ledger composes (fl_app/privacy/accountants/events.py).
PrivacyEvent = SampledGaussianEvent | GDPEvent | SkellamEvent


class Mechanism:
    """One step of the pipeline: a client step, a server step and its own state across rounds (pfl-research's
    postprocessor shape). The default steps leave the update / the average as they are; the default state is none.
    A strategy builds its mechanisms once, so a server step may keep state from round to round (a correlated-noise
    mechanism's), which ``state_dict`` / ``load_state_dict`` carry through checkpoints (JSON-serialisable)."""

    def client_step(self, update: NDArrays, step: ClientStep) -> NDArrays:
        return update

    def server_step(self, average: NDArrays, step: ServerStep) -> NDArrays:
        return average

    def privacy_event(self, release: ReleaseParameters) -> PrivacyEvent | None:
        """The privacy event one release of this mechanism makes, which the run's ledger composes (None: the step
        releases nothing of its own — clipping, masks and post-processing)."""
        return None

    def rerelease_refusal(self) -> str | None:
        """Why a round this mechanism released with OS-CSPRNG noise cannot be released again with fresh noise
        (a resume re-runs the rounds after its checkpoint), or None: each re-release is a new event the ledger
        composes."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint stores of this mechanism ({} = stateless)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def state_arrays(self) -> NDArrays:
        """The model-sized part of the state (a correlated-noise mechanism's buffers), stored beside the model in
        the checkpoint's arrays ([] = none)."""
        return []

    def load_state_arrays(self, arrays: NDArrays) -> None:
        """Restore what :meth:`state_arrays` returned (called after :meth:`load_state_dict`)."""
        if arrays:
            raise ValueError(f"{type(self).__name__} keeps no arrays, the checkpoint holds {len(arrays)}")


@dataclass(frozen=True)
class SharedMask(Mechanism):
    """Fed-SMP's public per-round mask (docs/algorithms.md): Δ ⊙ mask, divided by p when ``rescale`` (unbiased)."""

    sparsity: float
    rescale: bool = False

    def client_step(self, update: NDArrays, step: ClientStep) -> NDArrays:
        if step.shared_mask is None:
            raise ValueError("recipe shared_mask needs the round's mask from the server")
        step.mask = list(step.shared_mask)
        update = mech.apply_mask(update, step.mask)
        if self.rescale:
            update = [u / np.asarray(self.sparsity, dtype=u.dtype) for u in update]
        return update


@dataclass(frozen=True)
class LocalTopK(Mechanism):
    """The client's own per-layer top-k of |Δ| (k_l = ⌈p·d_l⌉) before clipping (Fed-SMP-topk, LUS)."""

    sparsity: float

    def client_step(self, update: NDArrays, step: ClientStep) -> NDArrays:
        step.mask = mech.topk_mask(update, self.sparsity)
        return mech.apply_mask(update, step.mask)


class Clip(Mechanism):
    """Clip Δ to C on its global L2 norm (Eq. 10). With C = 0 (non-private) the update passes unclipped and the
    steps after it (noise, masks of the noisy update) do not run."""

    def client_step(self, update: NDArrays, step: ClientStep) -> NDArrays:
        if step.clip_norm <= 0:
            step.pre_clip_norm = mech.global_l2_norm(update)
            raise _Unclipped(update)
        clipped, step.pre_clip_norm = mech.clip_update(update, step.clip_norm)
        step.clipped = clipped
        return clipped


class GaussianNoise(Mechanism):
    """The Gaussian mechanism (Eq. 11): the client adds its share N(0, noise_std²) when it has one; the server adds
    its share to the average (the placement says which share is whose)."""

    def client_step(self, update: NDArrays, step: ClientStep) -> NDArrays:
        if step.noise_std is None:
            return update
        step.noised = True
        return mech.add_gaussian_noise(update, step.noise_std, step.rng)

    def server_step(self, average: NDArrays, step: ServerStep) -> NDArrays:
        return mech.add_gaussian_noise(average, step.noise_std, step.rng)

    def privacy_event(self, release: ReleaseParameters) -> PrivacyEvent:
        # The aggregate's noise is N(0, σ²C²/m²) over the fixed m whoever adds it (the placement): one sampled
        # Gaussian release of sensitivity C/m.
        return SampledGaussianEvent(release.noise_multiplier, release.sample_rate)


class NoiseOnSupport(Mechanism):
    """Fed-SMP: noise only on the kept coordinates. A client that noised its update restricts it to its support
    again; the server restricts the noisy average to the round's shared mask or, with clients' own masks, to the
    union of the supports of what arrived (a cohort's sum has its clients' union, up to exact cancellation)."""

    def client_step(self, update: NDArrays, step: ClientStep) -> NDArrays:
        if step.noised and step.mask is not None:
            return mech.apply_mask(update, step.mask)
        return update

    def server_step(self, average: NDArrays, step: ServerStep) -> NDArrays:
        if step.mask is not None:
            return mech.apply_mask(average, step.mask)
        support = [np.zeros(np.shape(a), dtype=bool) for a in average]
        for update in step.updates:
            support = [s | (u != 0) for s, u in zip(support, update, strict=True)]
        return mech.apply_mask(average, support)


@dataclass(frozen=True)
class TopKOfNoisy(Mechanism):
    """DP-FedSAM-topk (Eq. 12), client masks: keep the per-layer top-k of the client's noisy update."""

    sparsity: float

    def client_step(self, update: NDArrays, step: ClientStep) -> NDArrays:
        return mech.apply_mask(update, mech.topk_mask(update, self.sparsity))


@dataclass(frozen=True)
class TopKOfClipped(Mechanism):
    """DP-FedSAM-topk's non-DP option: the mask from the clean clipped update (its support leaks)."""

    sparsity: float

    def client_step(self, update: NDArrays, step: ClientStep) -> NDArrays:
        assert step.clipped is not None, "TopKOfClipped runs after Clip"
        return mech.apply_mask(update, mech.topk_mask(step.clipped, self.sparsity))


@dataclass(frozen=True)
class ServerTopK(Mechanism):
    """DP-FedSAM-topk with the server's mask (docs/algorithms.md): the per-layer top-k of the *noised average* —
    post-processing of exactly what the accountant analyses."""

    sparsity: float

    def server_step(self, average: NDArrays, step: ServerStep) -> NDArrays:
        return mech.apply_mask(average, mech.topk_mask(average, self.sparsity))


@dataclass(frozen=True)
class AbsoluteNoise(Mechanism):
    """Noisy-FedAvg / Noisy-FedProx (seed 004): N(0, std² I) with an absolute std on the uploaded update; the local
    steps clipped every gradient, there is no update clip."""

    std: float

    def client_step(self, update: NDArrays, step: ClientStep) -> NDArrays:
        step.pre_clip_norm = mech.global_l2_norm(update)
        return mech.add_gaussian_noise(update, self.std, step.rng)

    def privacy_event(self, release: ReleaseParameters) -> PrivacyEvent:
        # One release of the mechanism whose T-fold composition seed 004's GDP bound states (Thms 3 and 4).
        return GDPEvent()


class _Unclipped(Exception):
    """Raised by :class:`Clip` with C = 0: the rest of the client steps do not apply."""

    def __init__(self, update: NDArrays) -> None:
        self.update = update


class RecipeParams(Protocol):
    """What a recipe's builder reads (:class:`fl_app.instructions.RecipeSpec` on the wire)."""

    kind: str
    sparsity: float
    rescale: bool
    noise_std: float


RecipeBuilder = Callable[[RecipeParams], tuple[Mechanism, ...]]
RECIPES: dict[str, RecipeBuilder] = {}


def register_recipe(kind: str, builder: RecipeBuilder) -> None:
    """Make ``kind`` a recipe: ``builder(params)`` returns its mechanisms in the order they run."""
    if kind in RECIPES and RECIPES[kind] is not builder:
        raise ValueError(f"recipe {kind!r} is already registered")
    RECIPES[kind] = builder


def mechanisms_for(params: RecipeParams) -> tuple[Mechanism, ...]:
    """The mechanisms of the recipe ``params.kind``."""
    try:
        builder = RECIPES[params.kind]
    except KeyError:
        raise ValueError(f"unknown recipe {params.kind!r}; known: {sorted(RECIPES)}") from None
    return builder(params)


def run_client_steps(mechanisms: Sequence[Mechanism], update: NDArrays, step: ClientStep) -> tuple[NDArrays, float]:
    """The client steps on ``update`` in order; (what the client sends, ‖Δ‖ before clipping)."""
    try:
        for mechanism in mechanisms:
            update = mechanism.client_step(update, step)
    except _Unclipped as unclipped:
        update = unclipped.update
    if math.isnan(step.pre_clip_norm):
        step.pre_clip_norm = mech.global_l2_norm(update)
    return update, step.pre_clip_norm


def run_server_steps(mechanisms: Sequence[Mechanism], average: NDArrays, step: ServerStep) -> NDArrays:
    """The server steps on the round's average, in order."""
    for mechanism in mechanisms:
        average = mechanism.server_step(average, step)
    return average


register_recipe("dense", lambda p: (Clip(), GaussianNoise()))
register_recipe("topk_noisy", lambda p: (Clip(), GaussianNoise(), TopKOfNoisy(p.sparsity)))
register_recipe("topk_clean", lambda p: (Clip(), GaussianNoise(), TopKOfClipped(p.sparsity)))
register_recipe("shared_mask", lambda p: (SharedMask(p.sparsity, p.rescale), Clip(), GaussianNoise(), NoiseOnSupport()))
register_recipe("topk_local", lambda p: (LocalTopK(p.sparsity), Clip(), GaussianNoise(), NoiseOnSupport()))
register_recipe("lus", lambda p: (LocalTopK(p.sparsity), Clip(), GaussianNoise()))
register_recipe("noisy_model", lambda p: (AbsoluteNoise(p.noise_std),))
register_recipe("clip", lambda p: (Clip(),))
