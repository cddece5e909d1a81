"""Error feedback under dynamic loss scaling (mixed precision), written once for both
frameworks.

With a loss scaler, the gradients a compressor receives are the true gradients times the
scaler's current scale S. A residual (and DGC's momentum) keeps values in the scale they were
stored under, so every state remembers the scale of its last update. A dynamic scaler changes
S only at the end of a step: it multiplies S by ``backoff_factor`` (< 1) after a step whose
gradients held an inf or NaN (and skips that step), else by ``growth_factor`` (> 1) after
``growth_interval`` good steps in a row. So, at the next compress of a state:

- the scale is LOWER than the remembered one: the step of the last update overflowed and was
  skipped. Its update must leave no trace: restore the state (and the step counter) from the
  backup taken just before that update (when there is one: a state restored from a
  checkpoint has none, and none is needed, see `Compressor.state_dict`);
- the scale differs from the remembered one (after the rollback, which restores a state in
  the remembered scale): multiply the state by new / remembered. For scales and factors that
  are powers of two (the defaults: 2**16, 2, 0.5) this is exact in floating point;
- then the state remembers the new scale, takes its backup and packs as usual.

This assumes each state is updated once per scaler step, which holds under Horovod: its
DistributedOptimizer compresses every parameter every step (zeros for a missing gradient).
The frameworks apply the decision (sparsecomm/torch/state.py; in TF inside the graph), with
`decide` evaluated on floats (torch) or tensors (TF: `select=tf.where`).
"""

import numbers
from dataclasses import dataclass

UNSET = 0.0  # the remembered scale of a state never updated under a scale (any real scale is > 0)


def _select(condition, then, otherwise):
    return then if condition else otherwise


@dataclass(frozen=True)
class Decision:
    """What one state does at a compress (or when settled for a checkpoint)."""

    rollback: object  # restore the backup (state and step): the last update's step overflowed
    factor: object  # then multiply residual and momentum by this (1: leave them)


def decide(remembered, current, backed_up=True, select=_select):
    """The decision for a state that remembers scale `remembered` (UNSET: none yet) when the
    scaler's scale is `current`; `backed_up`: a backup of the state before its last update
    exists. Plain arithmetic, comparisons, `&` and `select(condition, then, otherwise)`, so
    that a TF graph can evaluate it on tensors (with `select=tf.where`)."""
    known = remembered > UNSET
    rollback = backed_up & (current < remembered)  # never while unknown: current > 0 = UNSET
    factor = select(known, current / select(known, remembered, 1.0), 1.0)
    return Decision(rollback, factor)


def check_type(owner, scaler, kind, what):
    """Refuses a loss_scaler= that is not a `kind`, the framework's scaler (`what` names it); None is the caller's."""
    if not isinstance(scaler, kind):
        raise TypeError(
            f"{owner}: loss_scaler should be None or the {what} that scales the loss, got {type(scaler).__name__}"
        )


def check_factors(owner, backoff_factor, growth_factor):
    """The scaler must lower its scale after an overflow (that is how an overflow is seen here)
    and raise it otherwise: backoff_factor in (0, 1), growth_factor > 1."""

    def number(value):
        return not isinstance(value, bool) and isinstance(value, numbers.Real)

    if not (number(backoff_factor) and 0.0 < backoff_factor < 1.0):
        raise ValueError(
            f"{owner}: loss_scaler's backoff_factor should be in (0, 1): an overflow is detected from a "
            f"lowered scale; got {backoff_factor!r}"
        )
    if not (number(growth_factor) and growth_factor > 1.0):
        raise ValueError(
            f"{owner}: loss_scaler's growth_factor should be > 1: a lowered scale must mean an "
            f"overflow; got {growth_factor!r}"
        )
