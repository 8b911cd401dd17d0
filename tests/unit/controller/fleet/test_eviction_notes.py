"""What an eviction round tells, and where (security review 3, finding 4).

The node's Event goes to `default`, which more people read than any tenant's namespace, so
it may carry a count only; each evicted pod is told in its own namespace, about itself.
"""

from __future__ import annotations

import pytest

from controller.fleet import actions


def _pod(namespace: str, name: str) -> dict[str, str]:
    return {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name,
            "uid": f"uid-{namespace}-{name}"}  # fmt: skip


@pytest.mark.parametrize(
    "pods",
    [
        pytest.param([_pod("team-a", "trainer")], id="one tenant's pod is counted, not named"),
        pytest.param(
            [_pod("team-a", "trainer-0"), _pod("team-b", "secret-project-1")],
            id="pods of two tenants on one node are counted, neither named",
        ),
    ],
)
def test_the_nodes_eviction_note_names_no_pod_and_no_namespace(
    pods: list[dict[str, str]],
) -> None:
    """The node's note says how many pods went and nothing of whose they were."""
    node_note, _ = actions.eviction_notes("gpu-7", pods)
    named = [w for p in pods for w in (p["name"], p["namespace"]) if w in node_note]
    assert (named, str(len(pods)) in node_note) == ([], True), node_note


def test_each_evicted_pod_is_told_in_its_own_namespace_about_itself_only() -> None:
    """Each pod gets one note, regarding that pod (so its Event lands in its namespace),
    naming the node and no other pod."""
    pods = [_pod("team-a", "trainer-0"), _pod("team-b", "secret-project-1")]
    _, told = actions.eviction_notes("gpu-7", pods)
    seen = [
        (pod["namespace"], pod["name"], "gpu-7" in note,
         [o["name"] for o in pods if o is not pod and o["name"] in note])
        for pod, note in told
    ]  # fmt: skip
    assert seen == [
        ("team-a", "trainer-0", True, []),
        ("team-b", "secret-project-1", True, []),
    ]
