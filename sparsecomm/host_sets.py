"""The Horovod process sets exchange="hierarchical" runs on: one per host (its ranks, joined by
the host's own links) and one per local rank (that rank of every host, one NIC each). Horovod
0.28.1 registers process sets at hvd.init, so they are made first and handed to it, in either
framework (sparsecomm.torch and sparsecomm.tensorflow export host_process_sets):

    hvd.init(process_sets=sparsecomm.torch.host_process_sets())

The same objects come back on every call: the exchange finds them registered."""

from .core.hosts import HostLayout

_MADE = {}  # HostLayout -> HostSets: what host_process_sets handed to hvd.init


class HostSets:
    """The process sets of one layout, made before hvd.init (Horovod gives them ids there)."""

    def __init__(self, layout):
        from horovod.common.process_sets import ProcessSet

        self.layout = layout
        self.hosts = [ProcessSet(layout.host_ranks(h)) for h in range(layout.hosts)]
        self.cross = [ProcessSet(layout.cross_ranks(r)) for r in range(layout.per_host)]

    def to_register(self):
        """The sets hvd.init should register: a set of every rank is Horovod's global one already."""
        return [s for s in self.hosts + self.cross if len(s.ranks) < self.layout.size]

    def of_this_rank(self, hvd):
        """(this rank's host set, its cross set) under `hvd` (horovod.torch or horovod.tensorflow):
        the global set where one holds every rank."""
        self.layout.check(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.cross_rank())
        local, cross = self.hosts[hvd.cross_rank()], self.cross[hvd.local_rank()]
        return tuple(hvd.global_process_set if len(s.ranks) == self.layout.size else s for s in (local, cross))


def host_process_sets():
    """The process sets of this job's hosts (sparsecomm.core.hosts: from the launcher's
    environment), to hand to hvd.init(process_sets=...) before exchange="hierarchical" runs."""
    layout = HostLayout.from_environment()
    if layout not in _MADE:
        _MADE[layout] = HostSets(layout)
    return _MADE[layout].to_register()


def registered(hvd, ranks):
    """This rank's (host set, cross set) under `hvd` (horovod.torch or horovod.tensorflow), for an
    exchange over `ranks` ranks; or an error saying what to do: leave the process set to every rank,
    or register the hosts' sets."""
    if ranks != hvd.size():
        raise ValueError(
            f"exchange='hierarchical' runs over every rank's hosts, not a process set of {ranks} of "
            f"{hvd.size()} ranks: leave process_set=None"
        )
    layout = HostLayout(hvd.size(), hvd.local_size())
    sets = _MADE.get(layout)
    if sets is None and not HostSets(layout).to_register():  # one rank: nothing to register
        sets = _MADE[layout] = HostSets(layout)
    if sets is None or any(s.process_set_id is None for s in sets.to_register()):
        raise RuntimeError(
            "exchange='hierarchical' runs on the process sets of the hosts, which Horovod registers at init: "
            "call hvd.init(process_sets=sparsecomm.torch.host_process_sets()) (or sparsecomm.tensorflow's) "
            "before training"
        )
    return sets.of_this_rank(hvd)


def measurable(hvd, ranks):
    """(HostLayout, this rank's host set) where exchange="auto" may route "hierarchical": an exchange
    over every rank, on 2 hosts or more of 2 ranks or more, the hosts' process sets registered;
    None otherwise (as `registered`, starting nothing)."""
    if not hvd.is_initialized() or ranks != hvd.size() or hvd.size() % hvd.local_size():
        return None
    layout = HostLayout(hvd.size(), hvd.local_size())
    sets = _MADE.get(layout)
    if layout.hosts < 2 or layout.per_host < 2 or sets is None:
        return None
    if any(s.process_set_id is None for s in sets.to_register()):
        return None
    return layout, sets.of_this_rank(hvd)[0]
