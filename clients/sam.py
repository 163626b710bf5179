"""Sharpness-Aware Minimization (SAM) and its adaptive variant (ASAM) as a wrapping optimizer.

Implements the local optimizer of DP-FedSAM (journal version, Eqs. 8–9), which is SAM of Foret et al., 2021,
"Sharpness-Aware Minimization for Efficiently Improving Generalization":

    g   = ∇F(w; ξ)
    e   = ρ · g / ‖g‖                      (Eq. 8; ‖·‖ is the global norm over *all* parameters)
    g̃   = ∇F(w + e; ξ)                     (same mini-batch ξ)
    w  ← BaseStep(w, g̃)                    (Eq. 9; the step is taken from the *unperturbed* w)

With ``adaptive=True`` the perturbation is the ASAM one of Kwon et al., 2021, "ASAM: Adaptive Sharpness-Aware
Minimization for Scale-Invariant Learning of Deep Neural Networks", with the element-wise operator T_w = |w|:

    e   = ρ · T_w² g / ‖T_w g‖ = ρ · (w² ⊙ g) / ‖ |w| ⊙ g ‖

ASAM is off by default (docs/algorithms.md: the paper describes plain SAM; the released code only enables ASAM through
an argparse bug). The interface follows the widely used davda54/sam layout (``first_step`` / ``second_step`` /
``step(closure)``), but the state handling differs: the pre-perturbation weights are stored and copied back, and
``state_dict`` carries the base optimizer's state (e.g. momentum buffers).

This module knows nothing about differential privacy or federated learning.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

__all__ = ["SAM", "frozen_batchnorm_stats"]

# Buffers that a normalisation layer updates in train mode; the perturbed SAM pass must not touch them.
_RUNNING_STAT_BUFFERS: tuple[str, ...] = ("running_mean", "running_var", "num_batches_tracked")


class SAM(torch.optim.Optimizer):
    """SAM / ASAM wrapper around a base optimizer (Foret et al., 2021; Kwon et al., 2021; DP-FedSAM Eqs. 8–9).

    The base optimizer is constructed internally from ``base_optimizer_cls(self.param_groups, **base_kwargs)``
    and shares its ``param_groups`` (the very same list and dicts) with this wrapper, so a learning-rate
    schedule that edits ``sam.param_groups[i]["lr"]`` changes the base step.

    Typical use (two forward/backward passes per step)::

        loss_fn(model(x), y).backward()
        sam.first_step(zero_grad=True)          # w <- w + e
        loss_fn(model(x), y).backward()         # gradient at the perturbed point, same batch
        sam.second_step(zero_grad=True)         # w <- original w, then base step with that gradient

    or ``sam.step(closure)`` with a closure doing forward + backward.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        base_optimizer_cls: type[torch.optim.Optimizer],
        rho: float = 0.05,
        adaptive: bool = False,
        eps: float = 1e-12,
        **base_kwargs: Any,
    ) -> None:
        if rho < 0.0:
            raise ValueError(f"SAM radius rho must be non-negative, got {rho}")
        if eps <= 0.0:
            raise ValueError(f"eps must be positive, got {eps}")
        defaults: dict[str, Any] = dict(rho=rho, adaptive=adaptive, eps=eps, **base_kwargs)
        super().__init__(params, defaults)

        # The base optimizer gets the same group dicts, then both objects share one list, so groups added or
        # edited later are seen by both.
        self.base_optimizer: torch.optim.Optimizer = base_optimizer_cls(self.param_groups, **base_kwargs)
        self.param_groups = self.base_optimizer.param_groups
        # Merged so that ``add_param_group`` on the wrapper fills in the base optimizer's defaults too.
        self.defaults.update(self.base_optimizer.defaults)
        self._perturbed: list[torch.Tensor] = []

    @property
    def is_perturbed(self) -> bool:
        """Whether ``first_step`` has moved the weights and they have not been restored yet."""
        return bool(self._perturbed)

    @torch.no_grad()
    def _grad_norm(self) -> torch.Tensor:
        """Global L2 norm of the (ASAM: |w|-scaled) gradient over every parameter of every group."""
        norms: list[torch.Tensor] = []
        device: torch.device | None = None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if device is None:
                    device = p.device
                g = p.abs() * p.grad if group["adaptive"] else p.grad
                norms.append(torch.linalg.vector_norm(g, 2).to(device))
        if not norms:
            return torch.zeros(())
        return torch.linalg.vector_norm(torch.stack(norms), 2)

    @torch.no_grad()
    def first_step(self, zero_grad: bool = True) -> None:
        """Ascent step w ← w + e (Eq. 8), using the gradients currently stored in ``p.grad``.

        w + e is written into a buffer of the parameter's shape and strides, kept from step to step, and the
        parameter is pointed at it (``p.data``); the unperturbed tensor is kept aside, so ``second_step``/``restore``
        put w back bit-exactly by pointing the parameter at it again (subtracting e would accumulate rounding error
        over many steps), without copying the weights either way. The buffer holds g·s (ASAM: ·w²) plus w, the
        same floating-point operations as w + e computed in place, so the perturbed weights are the same bits.
        """
        if self._perturbed:
            raise RuntimeError("first_step() called twice without second_step()/restore() in between")
        grad_norm = self._grad_norm()
        for group in self.param_groups:
            # eps keeps a zero gradient (e.g. a perfectly fitted batch) from producing 0/0 = NaN.
            scale = group["rho"] / (grad_norm + group["eps"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                buffer = state.get("perturbed")
                if (
                    buffer is None
                    or buffer.shape != p.shape
                    or buffer.stride() != p.stride()
                    or buffer.dtype != p.dtype
                    or buffer.device != p.device
                ):
                    buffer = state["perturbed"] = torch.empty_like(p.data, memory_format=torch.preserve_format)
                # e = g·s (ASAM: g·s·w²), then e + w: addition commutes exactly, so these are w + e's bits.
                torch.mul(p.grad, scale.to(device=p.device, dtype=p.dtype), out=buffer)
                if group["adaptive"]:
                    buffer.mul_(p.square())
                buffer.add_(p)
                state["old_p"] = p.data
                p.data = buffer
                self._perturbed.append(p)
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def restore(self) -> None:
        """Undo ``first_step`` without taking a base step (e.g. when the perturbed loss is not finite)."""
        for p in self._perturbed:
            p.data = self.state[p].pop("old_p")
        self._perturbed = []

    @torch.no_grad()
    def second_step(self, zero_grad: bool = True) -> None:
        """Restore w and take the base step with the gradient computed at w + e (Eq. 9)."""
        if not self._perturbed:
            raise RuntimeError("second_step() called without a preceding first_step()")
        self.restore()
        self.base_optimizer.step()
        if zero_grad:
            self.zero_grad()

    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:  # type: ignore[override]
        """One full SAM step; ``closure`` must run forward + backward and return the loss.

        The closure is called exactly twice (at w, then at w + e). Gradients are zeroed before each call, so
        the closure need not do it. Returns the loss at the unperturbed point.
        """
        if closure is None:
            raise ValueError("SAM.step() needs a closure that runs forward and backward and returns the loss")
        grad_closure = torch.enable_grad()(closure)
        self.zero_grad()
        loss = grad_closure()
        self.first_step(zero_grad=True)
        grad_closure()
        # Gradients at w + e are left in place, as a normal optimizer step leaves its gradients.
        self.second_step(zero_grad=False)
        return loss

    def state_dict(self) -> dict[str, Any]:
        """The base optimizer's state (momentum buffers, ...) plus the shared groups (which hold rho etc.).

        The transient copy of the unperturbed weights is not saved: between full steps it is meaningless.
        """
        if self._perturbed:
            raise RuntimeError("cannot save SAM state between first_step() and second_step()")
        return self.base_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a ``state_dict`` produced by :meth:`state_dict`, keeping the groups shared with the base."""
        self.base_optimizer.load_state_dict(state_dict)
        # torch replaces the group list on load; re-share it and fill SAM keys missing from foreign dicts.
        for group in self.base_optimizer.param_groups:
            for key in ("rho", "adaptive", "eps"):
                group.setdefault(key, self.defaults[key])
        self.param_groups = self.base_optimizer.param_groups
        self._perturbed = []


@contextmanager
def frozen_batchnorm_stats(model: nn.Module) -> Iterator[None]:
    """Keep BatchNorm (and tracking InstanceNorm) running statistics unchanged inside the block.

    Used around SAM's perturbed forward pass so that only the pass at w updates the statistics. Layers stay
    in train mode, so the perturbed pass still normalises with batch statistics exactly like the first pass.

    Statistics are saved and copied back rather than setting ``momentum = 0`` (the davda54 trick) because
    momentum 0 still increments ``num_batches_tracked`` (which drives the cumulative average when
    ``momentum is None``) and turns the running stats into NaN when the perturbed batch statistics are
    non-finite (0 · inf = NaN).
    """
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    for module in model.modules():
        if not isinstance(module, _NormBase):
            continue
        for name in _RUNNING_STAT_BUFFERS:
            buf = getattr(module, name, None)
            if isinstance(buf, torch.Tensor):
                saved.append((buf, buf.detach().clone()))
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, copy in saved:
                buf.copy_(copy)
