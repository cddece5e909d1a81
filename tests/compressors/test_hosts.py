"""The layout of the hosts exchange="hierarchical" runs on (sparsecomm.core.hosts), read from
the launcher's environment, and what is refused before any collective starts."""

import pytest

from sparsecomm.core.hosts import HostLayout


@pytest.mark.parametrize(
    "environ, layout",
    [
        ({"HOROVOD_SIZE": "6", "HOROVOD_LOCAL_SIZE": "3"}, HostLayout(6, 3)),
        ({"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, HostLayout(8, 4)),
        ({"PMI_SIZE": "4", "MPI_LOCALNRANKS": "1"}, HostLayout(4, 1)),
        ({"HOROVOD_SIZE": "4", "HOROVOD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_SIZE": "9"}, HostLayout(4, 2)),
    ],
)
def test_the_launchers_environment_gives_the_layout(environ, layout):
    assert HostLayout.from_environment(environ) == layout


def test_the_hosts_ranks_and_each_local_ranks_peers():
    layout = HostLayout(6, 3)
    assert layout.hosts == 2
    assert [layout.host_ranks(h) for h in range(2)] == [[0, 1, 2], [3, 4, 5]]
    assert [layout.cross_ranks(r) for r in range(3)] == [[0, 3], [1, 4], [2, 5]]
    layout.check(rank=4, size=6, local_rank=1, cross_rank=1)


def test_no_launcher_names_the_variables_it_reads():
    with pytest.raises(
        RuntimeError, match=r"HOROVOD_SIZE/HOROVOD_LOCAL_SIZE, OMPI_COMM_WORLD_SIZE/.*run under horovodrun"
    ):
        HostLayout.from_environment({"HOROVOD_SIZE": "4"})


def test_hosts_of_unequal_sizes_are_refused():
    with pytest.raises(ValueError, match=r"hosts of equal numbers of ranks: got 4 ranks with 3 on this host"):
        HostLayout.from_environment({"HOROVOD_SIZE": "4", "HOROVOD_LOCAL_SIZE": "3"})
    with pytest.raises(RuntimeError, match=r"rank 3 of 4 is local rank 0 on host 1, not where 2 hosts of 2"):
        HostLayout(4, 2).check(rank=3, size=4, local_rank=0, cross_rank=1)
