"""What a compressor says about itself, written once: its settings text and stats() (the
cross-rank check of the settings is sparsecomm.core.agreement)."""

import itertools

_instances = itertools.count()  # names each compressor's settings check, in construction order (same on every rank)

# The per-tensor counters of stats(): what this rank handed the collectives.
COUNTERS = ("calls", "sent_elements", "dense_bytes", "sent_bytes", "received_bytes")


def next_instance():
    return next(_instances)


def settings_text(owner, settings):
    """`Owner(k=v, ...)`, sorted by name: what every rank must share."""
    return f"{owner}({', '.join(f'{k}={v!r}' for k, v in sorted(settings.items()))})"


def tensor_stats(counters, numel, choice):
    """One tensor's stats: its counters, numel, density (sent elements per call / numel; 1 when
    dense or never called) and, for the per-rank-coordinate methods, the exchange chosen, the
    cost model's predicted seconds of each and, where auto watched the backward pass, the
    seconds of the exchange it predicted hidden (hidden_seconds; watching_backward while it
    still watches; route_trial and route_trial_seconds where it tried its routes)."""
    calls = counters["calls"]
    density = counters["sent_elements"] / (calls * numel) if calls and numel else 1.0
    return dict(counters, numel=numel, density=density, **(choice or {}))


def totals(tensors, keys=("calls", "dense_bytes", "sent_bytes", "received_bytes")):
    return {key: sum(t[key] for t in tensors.values()) for key in keys}
