"""Worker of the per-host network model with several ranks per host (benchmarks.network):
prints each rank's Horovod layout and the bytes its host's NIC sent during an allreduce inside
the host (its process set) and during one over every rank."""

import os
import socket

import horovod.torch as hvd
import torch

NUMEL = 2_000_000  # 8 MB of float32: far above Horovod's control messages


def nic_sent_bytes():
    with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
        return int(f.read())


def sent_during(allreduce):
    hvd.barrier()  # every rank's earlier traffic has ended
    before = nic_sent_bytes()
    allreduce()
    hvd.barrier()
    return nic_sent_bytes() - before


def main():
    size, per_host = int(os.environ["HOROVOD_SIZE"]), int(os.environ["HOROVOD_LOCAL_SIZE"])
    hosts = [hvd.ProcessSet(list(range(h * per_host, (h + 1) * per_host))) for h in range(size // per_host)]
    hvd.init(process_sets=hosts)
    mine = hosts[hvd.rank() // per_host]
    value = torch.full((NUMEL,), float(hvd.rank()))
    # the first allreduce inside the host also opens its connections: only the second is counted
    local = hvd.allreduce(value, op=hvd.Sum, process_set=mine)
    local_sent = sent_during(lambda: hvd.allreduce(value, op=hvd.Sum, process_set=mine))
    every_sent = sent_during(lambda: hvd.allreduce(value, op=hvd.Sum))
    line = (
        f"[layout] rank {hvd.rank()} size {hvd.size()} local_rank {hvd.local_rank()} local_size {hvd.local_size()} "
        f"cross_rank {hvd.cross_rank()} cross_size {hvd.cross_size()} host {socket.gethostname()} "
        f"local_sum {float(local[0])} local_nic_bytes {local_sent} every_nic_bytes {every_sent}\n"
    )
    os.write(1, line.encode())  # one write: print's two would interleave with the other ranks' lines


if __name__ == "__main__":
    main()
