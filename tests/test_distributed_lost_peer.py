"""A trainer that dies between the meeting and the first collective: the others stop within the
peer timeout, naming it, however their main thread is held (the kill campaign's two findings)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distributed_runs import free_port, trainer_env

PEER_TIMEOUT = 3.0
STORE_TIMEOUT = 30.0  # a store call's bound (at least 30 s), which a gloo group's making waits out

# Each rank joins, meets the others once; rank 2 then dies without a word (as under SIGKILL), and
# the others go on into a gloo call: a broadcast on a group the three made ("broadcast", where gloo
# answers with a plain RuntimeError), or making a new group ("new-group", where the main thread
# waits in C code for rank 2's address for the store's whole timeout, 30 s, holding the store
# client: the sentry must not take that for a stopped rank 0). In "before-group", rank 2 dies right
# after the meeting, before it gives gloo its address: the others wait for it the group's timeout,
# then name it by a roll call (the kill campaign's trial 159 of seed 4712).
DRIVER = textwrap.dedent("""
    import os, sys
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    from pbgio.errors import PbgioError
    from pbgtrain.distributed.cluster import Cluster, Launch

    rank, port, scenario, peer_timeout = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
    launch = Launch(rank, 3, f"tcp://127.0.0.1:{port}", "--rank")
    if scenario == "before-group" and rank == 2:  # dies once all have met, before gloo has its address
        meet = Cluster._meet_over_tcp

        def meet_then_die(self, timeout):
            meet(self, timeout)
            os._exit(0)

        Cluster._meet_over_tcp = meet_then_die
    try:
        with Cluster(launch, peer_timeout=peer_timeout) as cluster, cluster.translating_interrupts():
            group = dist.new_group(backend="gloo") if scenario == "broadcast" else None
            cluster.barrier("met")
            if rank == 2:
                os._exit(0)
            if scenario == "broadcast":
                dist.broadcast(torch.zeros(1000), src=0, group=group)
            else:
                with cluster.holding_the_store(30.0):  # as pbgtrain makes its groups: with a timeout
                    dist.new_group(backend="gloo", timeout=timedelta(seconds=30))
            cluster.barrier("done")  # waits (polling) until the watchdog names the lost rank
            print("no failure seen", flush=True)
    except PbgioError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
""")


@pytest.mark.distributed
@pytest.mark.parametrize("scenario", ["broadcast", "new-group", "before-group"])
def test_a_rank_lost_before_the_first_collective_is_named_in_time(scenario: str) -> None:
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", DRIVER, str(rank), str(port), scenario, str(PEER_TIMEOUT)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=trainer_env())
             for rank in range(3)]
    procs[2].wait(timeout=120)
    lost_at = time.monotonic()
    for rank, proc in enumerate(procs[:2]):
        _out, err = proc.communicate(timeout=120)
        took = time.monotonic() - lost_at
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert proc.returncode == 1, (rank, err)
        assert "Traceback" not in err, err
        assert len(errors) == 1 and "rank 2" in errors[0], err
        assert took < PEER_TIMEOUT + 10 + (STORE_TIMEOUT if scenario != "broadcast" else 0), (rank, took, err)


def test_the_sentrys_interrupt_while_a_failed_meeting_is_reported_is_the_peer_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 killed before its store listened: the others' connect waits in C code; the sentry
    fails the run and interrupts the main thread, whose call may return just then, so that the
    interrupt lands while the meeting's own error is being written (the kill campaign's trial 72 of
    seed 4710: "interrupted", exit 130). It is the sentry's failure, naming rank 0, either way."""
    from torch.distributed import DistError

    from pbgtrain.distributed.cluster import Cluster, Launch, PeerFailure

    cluster = Cluster(Launch(1, 3, "tcp://127.0.0.1:9", "--rank"), peer_timeout=PEER_TIMEOUT)

    class ConnectTimedOut(DistError):
        def __str__(self) -> str:  # read by the meeting's error message: the interrupt arrives now
            cluster._fail(0, "the run's store, served by rank 0, did not answer within 35 s")
            return "The client socket has timed out after 30000ms"

    def join(timeout: object) -> None:
        raise ConnectTimedOut

    monkeypatch.setattr(cluster, "_join", join)
    with pytest.raises(PeerFailure, match="served by rank 0") as failed:
        cluster.__enter__()
    assert failed.value.rank == 0
    cluster._stop.set()
