"""A rank that dies in the middle of a step ends the whole horovodrun job, with a non-zero
exit, soon after: no sparsecomm collective waits forever. tests/workers/crash.py: rank 1
dies in the backward pass of step 5 (os._exit(3) or SIGKILL), after its output layer's
gradients were compressed and their exchange started; the other ranks train on, and block in
that step's collectives until Horovod shuts down and horovodrun ends them."""

import re
import time

import pytest
from launch import horovodrun_outcome

# Seconds from the death to the end of the job. horovodrun ends the other ranks as soon as one
# exits non-zero (SIGTERM, SIGKILL 5 s later); Gloo sees the dead peer's closed connections
# at once. Measured: 0.1-0.2 s in each of the five cases (2026-11-25). Start-up is not counted:
# a TF rank takes 15-60 s to start on a busy 2-core machine.
AFTER_DEATH = 30


@pytest.mark.parametrize(
    "size,framework,exchange,how",
    [
        (2, "torch", "allgather", "exit"),
        (2, "torch", "spardl", "kill"),
        (2, "tf", "allgather", "kill"),
        (2, "tf", "spardl", "exit"),
        (3, "torch", "spardl", "exit"),
    ],
    ids=lambda v: str(v),
)
def test_a_rank_dying_mid_step_ends_the_job(size, framework, exchange, how):
    code, output, seconds = horovodrun_outcome(
        size, "crash.py", "--framework", framework, "--exchange", exchange, "--how", how, timeout=300
    )
    ended = time.time()
    died = re.search(r"rank 1: dying at step 5, time (\d+\.\d+)", output)
    assert died, f"rank 1 did not die where it should:\n{output[-4000:]}"
    after_death = ended - float(died.group(1))
    print(
        f"np{size} {framework} {exchange} {how}: exit {code}, the job ended {after_death:.1f}s after the death "
        f"({seconds:.1f}s in all)"
    )
    assert code != 0, f"the job exited 0 although rank 1 died:\n{output[-4000:]}"
    assert all(f"rank {r}: training" in output for r in range(size)), f"a rank never trained:\n{output[-4000:]}"
    assert not re.search(r"rank \d+: trained", output), f"a rank finished training:\n{output[-4000:]}"
    assert after_death < AFTER_DEATH, f"the job ended {after_death:.1f}s after the death:\n{output[-4000:]}"
