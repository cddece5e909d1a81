"""The Horovod process sets exchange="hierarchical" runs on: one per host (its ranks, joined by
the host's own links) and one per local rank (that rank of every host, one NIC each). Horovod
0.28.1 registers process sets at hvd.init, so they are made first and handed to it, in either
framework (sparsecomm.torch and sparsecomm.tensorflow export host_process_sets):

    hvd.init(process_sets=sparsecomm.torch.host_process_sets())

The same objects come back on every call: the exchange finds them registered.

The exchange's last phase runs inside each host, and Horovod shuts down for every rank as soon
as one rank exits: a rank that used the hosts' sets therefore waits at exit until every rank has
reached its own (end_together)."""

import atexit
import sys
import threading

from .core.hosts import HostLayout

_MADE = {}  # HostLayout -> HostSets: what host_process_sets handed to hvd.init
# The most seconds a rank waits at exit for the others (end_together): long enough for a rank
# that saves a checkpoint first, short enough that a rank gone astray does not hold the job.
END_OF_JOB_SECONDS = 60.0
_ENDING = set()  # the horovod modules (by name) whose end_together is armed


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
    end_together(hvd)
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
    end_together(hvd)
    return layout, sets.of_this_rank(hvd)[0]


def end_together(hvd):
    """Holds this process's exit, at most END_OF_JOB_SECONDS, until every rank has reached its
    own: a host may still be gathering inside itself when another host's ranks are done, and an
    exit shuts Horovod down for every rank. Not after an uncaught error (the others then fail at
    once, as Horovod's ranks do) or after hvd.shutdown(). Once per horovod module, and cheap after."""
    if hvd.__name__ in _ENDING:
        return
    start, done = threading.Event(), threading.Event()

    def handshake():  # started now: Python 3.12 refuses new threads while the interpreter exits
        start.wait()
        try:
            hvd.allgather_object(None, name="sparsecomm.end_of_job")
        except Exception:  # Horovod shut down under it: another rank failed or stopped waiting
            pass
        done.set()

    def at_exit():  # registered after hvd.init's own shutdown, so it runs before it
        if not hasattr(sys, "last_value") and hvd.is_initialized():
            start.set()
            done.wait(END_OF_JOB_SECONDS)

    threading.Thread(target=handshake, name="sparsecomm-end-of-job", daemon=True).start()
    atexit.register(at_exit)
    _ENDING.add(hvd.__name__)
