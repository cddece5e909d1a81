"""The hosts of a job, for exchange="hierarchical": H hosts of R ranks each, host h holding ranks
h * R to h * R + R - 1, as horovodrun and mpirun place them. Read from the launcher's environment,
so that the process sets of the hosts can be handed to hvd.init before it runs."""

import os
from dataclasses import dataclass

# (number of ranks, ranks on this host): horovodrun's variables, then Open MPI's and MPICH's.
LAUNCHER_VARIABLES = (
    ("HOROVOD_SIZE", "HOROVOD_LOCAL_SIZE"),
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_SIZE", "MPI_LOCALNRANKS"),
)


@dataclass(frozen=True)
class HostLayout:
    """`size` ranks on hosts of `per_host` ranks each."""

    size: int
    per_host: int

    def __post_init__(self):
        if self.size < 1 or self.per_host < 1 or self.size % self.per_host:
            raise ValueError(
                f"exchange='hierarchical' needs hosts of equal numbers of ranks: got {self.size} ranks "
                f"with {self.per_host} on this host"
            )

    @classmethod
    def from_environment(cls, environ=None):
        """The layout the launcher describes in this process's environment."""
        environ = os.environ if environ is None else environ
        for size, local in LAUNCHER_VARIABLES:
            if size in environ and local in environ:
                return cls(int(environ[size]), int(environ[local]))
        named = ", ".join(f"{size}/{local}" for size, local in LAUNCHER_VARIABLES)
        raise RuntimeError(
            f"exchange='hierarchical' needs the layout of the hosts, which the launcher gives in its environment "
            f"({named}); none is set: run under horovodrun or mpirun"
        )

    @property
    def hosts(self):
        return self.size // self.per_host

    def host_ranks(self, host):
        """The ranks of host `host`, in order."""
        return list(range(host * self.per_host, (host + 1) * self.per_host))

    def cross_ranks(self, local_rank):
        """The ranks of local rank `local_rank` on every host, in host order."""
        return [host * self.per_host + local_rank for host in range(self.hosts)]

    def check(self, rank, size, local_rank, cross_rank):
        """Refuses a running job whose ranks are not placed as this layout says."""
        if size != self.size or rank != cross_rank * self.per_host + local_rank:
            raise RuntimeError(
                f"exchange='hierarchical': rank {rank} of {size} is local rank {local_rank} on host {cross_rank}, "
                f"not where {self.hosts} hosts of {self.per_host} ranks in order put it; the hierarchical exchange "
                "needs every host to hold the same number of consecutive ranks"
            )
