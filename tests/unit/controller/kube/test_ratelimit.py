"""Which class a request to the API server is, and the asyncio limiter the clients await."""

from __future__ import annotations

import asyncio

import pytest

from controller import budget
from controller.budget import WriteClass
from controller.kube import client, ratelimit


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        pytest.param("PUT", "/apis/coordination.k8s.io/v1/namespaces/taugrid/leases/taugrid",
                     WriteClass.LEASE, id="renewing the lease is a lease write"),
        pytest.param("POST", "/apis/authentication.k8s.io/v1/tokenreviews",
                     WriteClass.REVIEW, id="a TokenReview is a review"),
        pytest.param("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                     WriteClass.REVIEW, id="an access review is a review"),
        pytest.param("PATCH", "/api/v1/nodes/gpu-node-0", WriteClass.NODE,
                     id="a taint or a cordon is a node write"),
        pytest.param("PATCH", "/api/v1/nodes/gpu-node-0/status", WriteClass.NODE,
                     id="a node condition is a node write"),
        pytest.param("POST", "/apis/resource.k8s.io/v1alpha3/devicetaintrules",
                     WriteClass.NODE, id="a DeviceTaintRule is a node write"),
        pytest.param("POST", "/api/v1/namespaces/team-a/pods/train-0/eviction",
                     WriteClass.EVICTION, id="an eviction is an eviction"),
        pytest.param("POST", "/api/v1/namespaces/default/events", WriteClass.EVENT,
                     id="an Event is an event"),
        pytest.param("POST", "/apis/batch/v1/namespaces/team-a/jobs", WriteClass.RUN,
                     id="a Job is a run write"),
        pytest.param("DELETE", "/api/v1/namespaces/team-a/pods/train-0", WriteClass.RUN,
                     id="deleting a pod is a run write"),
        pytest.param("POST", "/api/v1/nodes/gpu-node-0/proxy/x", WriteClass.RUN,
                     id="a path only starting like a node's is not a node write"),
        pytest.param("GET", "/api/v1/nodes", None, id="a read is not limited"),
        pytest.param("get", "/api/v1/nodes/gpu-node-0", None, id="in any case"),
    ],
)  # fmt: skip
def test_requests_are_classed_by_method_and_whole_path(
    method: str, path: str, expected: WriteClass | None
) -> None:
    """Writes by what they touch; reads are not limited."""
    assert expected == ratelimit.classify(method, path)


async def test_the_lease_write_goes_before_evictions_that_were_waiting() -> None:
    """Twenty evictions wait for a 200/s budget; a lease renewal arriving after them is the
    first to go, and every waiter is told how long it waited."""
    seen: list[tuple[WriteClass, float]] = []
    clock = [0.0]  # the budget's time moves only when the test says: no token comes early
    limiter = ratelimit.Limiter(
        budget.Rates(rate_per_s=200, burst=1, eviction_per_s=1000, eviction_burst=100),
        observe=lambda cls, waited: seen.append((cls, waited)), clock=lambda: clock[0],
    )  # fmt: skip
    await limiter.acquire(WriteClass.RUN)  # spends the burst
    order: list[str] = []

    async def write(name: str, cls: WriteClass) -> None:
        await limiter.acquire(cls)
        order.append(name)

    evictions = [asyncio.create_task(write(f"evict-{i}", WriteClass.EVICTION)) for i in range(20)]
    await asyncio.sleep(0)
    lease = asyncio.create_task(write("lease", WriteClass.LEASE))
    await asyncio.sleep(0)
    assert limiter.waiting == 21
    writes = asyncio.gather(lease, *evictions)
    while not writes.done():
        clock[0] += 0.005  # one token of 200/s
        await asyncio.sleep(0.002)
    await writes
    assert order[0] == "lease"
    assert [f"evict-{i}" for i in range(20)] == order[1:]
    assert len(seen) == 22
    assert limiter.waiting == 0


async def test_a_caller_that_gives_up_leaves_the_queue() -> None:
    """A write cancelled while it waits is withdrawn: nothing waits afterwards."""
    limiter = ratelimit.Limiter(budget.Rates(rate_per_s=0.001, burst=1))
    await limiter.acquire(WriteClass.RUN)
    stuck = asyncio.create_task(limiter.acquire(WriteClass.RUN))
    await asyncio.sleep(0)
    assert limiter.waiting == 1
    stuck.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stuck
    assert limiter.waiting == 0


async def test_a_write_that_waits_past_the_bound_fails_like_a_timed_out_call() -> None:
    """No write waits for ever: past `max_wait_s` it raises TimeoutError naming the budget."""
    limiter = ratelimit.Limiter(budget.Rates(rate_per_s=0.001, burst=1, max_wait_s=0.05))
    await limiter.acquire(WriteClass.RUN)
    with pytest.raises(TimeoutError, match="API write budget"):
        await limiter.acquire(WriteClass.EVENT)
    assert limiter.waiting == 0


async def test_a_flood_of_reviews_neither_spends_nor_delays_the_lease_and_node_writes() -> None:
    """Security review 3, finding 1: with the reviews' budget spent and a thousand reviews
    waiting, a lease renewal and a node write still go at once, from the write budget."""
    clock = [0.0]  # no token refills unless the test moves the clock
    limiter = ratelimit.Limiter(
        budget.Rates(rate_per_s=1, burst=2),
        reviews=budget.Rates(rate_per_s=1, burst=1),
        clock=lambda: clock[0],
    )
    await limiter.acquire(WriteClass.REVIEW)  # spends the reviews' burst
    reviews = [asyncio.create_task(limiter.acquire(WriteClass.REVIEW)) for _ in range(1000)]
    await asyncio.sleep(0)
    assert limiter.waiting == 1000
    await asyncio.wait_for(limiter.acquire(WriteClass.LEASE), timeout=5)
    await asyncio.wait_for(limiter.acquire(WriteClass.NODE), timeout=5)
    assert len(limiter.queues[budget.Pool.REVIEWS]) == 1000
    assert len(limiter.queue) == 0
    for task in reviews:
        task.cancel()
    await asyncio.gather(*reviews, return_exceptions=True)
    assert limiter.waiting == 0


async def test_a_callers_own_deadline_bounds_its_wait_for_the_budget() -> None:
    """The Lease's wait for the budget counts inside its renew deadline: a write given a
    deadline shorter than the budget's `max_wait_s` gives up at that deadline."""
    limiter = ratelimit.Limiter(budget.Rates(rate_per_s=0.001, burst=1, max_wait_s=3600))
    await limiter.acquire(WriteClass.RUN)
    with pytest.raises(TimeoutError, match=r"waited 0\.05 s for the API write budget"):
        await limiter.acquire(WriteClass.LEASE, max_wait_s=0.05)
    assert limiter.waiting == 0


@pytest.mark.parametrize(
    ("deadline_s", "waited_s", "expected"),
    [
        pytest.param(5.0, 0.0, 5.0, id="no wait leaves the whole deadline"),
        pytest.param(5.0, 2.0, 3.0, id="the wait is taken off the deadline"),
        pytest.param(5.0, 5.0, client.MIN_REQUEST_S, id="an exhausted deadline is never 0"),
    ],
)  # fmt: skip
def test_the_request_gets_what_is_left_of_its_deadline(
    deadline_s: float, waited_s: float, expected: float
) -> None:
    """The request after the budget wait is sent with the rest of the caller's deadline."""
    assert pytest.approx(expected) == client.remaining_timeout(deadline_s, waited_s)
