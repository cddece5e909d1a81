"""What a compressor says about itself, written once: its settings text and stats() (the
cross-rank check of the settings is sparsecomm.core.agreement)."""

import collections
import itertools

# the ranks of a process set -> a count of the compressors built over them (next_instance)
_instances = collections.defaultdict(itertools.count)

# The per-tensor counters of stats(): what this rank handed the collectives.
COUNTERS = ("calls", "sent_elements", "dense_bytes", "sent_bytes", "received_bytes")


def next_instance(process_set=None):
    """Names a compressor's settings check: its place among the compressors built before it over
    the same ranks (`process_set`: Horovod's names its ranks; None, the global set or anything
    else counts as every rank). So the name is the same on every rank of the set, whatever
    compressors a rank builds for other sets."""
    ranks = tuple(getattr(process_set, "ranks", None) or ())
    if not ranks or getattr(process_set, "process_set_id", None) == 0:
        return str(next(_instances[()]))
    return f"{next(_instances[ranks])}.ranks_{'_'.join(map(str, ranks))}"


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
