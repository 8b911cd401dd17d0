"""`helm test` on the dev cluster's own release: the chart's test pod (the controller's image)
runs for real on the real node, where the dev values put the controller, asks the controller's
/readyz through the relay and reads the AdmissionCheck's Active condition from the API server,
and Helm reports the suite passed. KWOK nodes run no container, so without the real node
(`devcluster.node.preflight` says why) the test skips with that reason."""

from __future__ import annotations

import asyncio
import pathlib
import subprocess

import pytest

from devcluster import chart, cluster, node, stack

pytestmark = pytest.mark.cluster


def helm_test(dev: cluster.Cluster, bin_dir: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """`helm test` of the dev release, with the test pod's log."""
    return subprocess.run(
        [str(chart.helm_binary(bin_dir)), "test", stack.RELEASE, "-n", stack.NAMESPACE,
         "--kubeconfig", str(dev.kubeconfig), "--logs", "--timeout", "4m"],
        capture_output=True, text=True, check=False, timeout=330,
    )  # fmt: skip


async def test_helm_test_passes_on_the_dev_clusters_release(
    dev_cluster: cluster.Cluster, bin_dir: pathlib.Path
) -> None:
    """The suite has the one pod, it succeeded, and its log shows both checks passed."""
    problems = node.preflight(bin_dir)
    if problems:
        pytest.skip("the real node cannot run here: " + "; ".join(problems))
    assert node.running(dev_cluster), (
        "the dev cluster runs no real node: start it with `taugrid dev up` (real node on)"
    )
    done = await asyncio.to_thread(helm_test, dev_cluster, bin_dir)
    out = done.stdout + done.stderr
    assert "TEST SUITE:     None" not in out, (
        "the dev release has no test hook: it was installed from an older chart; "
        "`taugrid dev up` from this checkout installs the current one\n" + out
    )
    assert done.returncode == 0, out
    assert f"TEST SUITE:     {stack.RELEASE}-test" in out, out
    assert "Phase:          Succeeded" in out, out
    assert "/readyz answers 200" in out, out
    assert f"PASS: AdmissionCheck {cluster.ADMISSION_CHECK} is Active" in out, out
    # The pod stays for `helm test --logs` until the next run: it ran on the real node.
    ran_on = dev_cluster.kubectl(
        bin_dir, "-n", stack.NAMESPACE, "get", "pod", f"{stack.RELEASE}-test",
        "-o", "jsonpath={.spec.nodeName}",
    )  # fmt: skip
    assert ran_on.strip() == node.NODE_NAME
