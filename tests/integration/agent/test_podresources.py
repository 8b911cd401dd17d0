"""Pod attribution end to end: a gRPC server implementing the kubelet's PodResources proto on a
Unix socket, the agent's generated client, the fake NVML's GPUs, and `/metrics`.

The client is generated from k8s.io/kubelet v0.37.2's api.proto by devcluster/podresources.py
(scripts/test builds it before pytest; here it is built on first use, like the fake NVML). The
server speaks the same proto (`devcluster.podresources.FakeKubelet`); the real-kubelet test
comes with the real node.
"""

from __future__ import annotations

import asyncio
import pathlib
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from aiohttp import test_utils
from prometheus_client.parser import text_string_to_metric_families

from agent import app as agent_app
from agent import attribution, metrics, monitoring, settings, snapshots
from agent.probing import podresources as pr_client
from devcluster import fakenvml, podresources

DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def fake() -> Iterator[fakenvml.InProcessControl]:
    """The fake NVML library, loaded once for the module."""
    control = fakenvml.InProcessControl(fakenvml.build())
    yield control
    control.reset_all()


@pytest.fixture(scope="module")
def client_dir() -> pathlib.Path:
    """The generated PodResources client."""
    return podresources.build()


@pytest.fixture
def sock_dir() -> Iterator[pathlib.Path]:
    """A short directory for the socket (AF_UNIX paths are limited to 107 bytes)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="pr-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(client_dir: pathlib.Path, sock_dir: pathlib.Path) -> AsyncIterator[Any]:
    """A PodResources server on a Unix socket."""
    server = podresources.FakeKubelet(client_dir, sock_dir / "kubelet.sock")
    await server.start()
    yield server
    await server.stop()


def config(tmp_path: pathlib.Path, sock: pathlib.Path, client: pathlib.Path, **extra: Any) -> Any:
    """Agent settings on the fake, with attribution pointed at the test's socket."""
    boot = tmp_path / "boot"
    boot.write_text("b\n")
    return settings.Settings(
        node_name="gpu-node-1",
        boot_id_path=boot,
        state_path=tmp_path / "state.json",
        kmsg_path=None,
        dcgm_enabled=False,
        auth_enabled=False,
        gauge_interval_s=0.05,
        podresources_socket=sock,
        podresources_client_dir=client,
        podresources_interval_s=0.05,
        **extra,
    )


async def started(cfg: settings.Settings) -> monitoring.Monitor:
    """A monitor with its first pass done (loops off: the test steps it)."""
    mon = monitoring.Monitor(cfg)
    await mon.start(loops=False)
    await mon.probe_once()
    return mon


def uuids(view: snapshots.View) -> list[str]:
    """The fake GPUs' UUIDs by index."""
    return [s.uuid for s in sorted(view.snapshots, key=lambda s: s.index)]


def labelled(view: snapshots.View, family: str) -> dict[str, dict[str, str]]:
    """gpu index -> labels of one dcgm-exporter family in /metrics."""
    families = {f.name: f for f in text_string_to_metric_families(metrics.render(view))}
    return {s.labels["gpu"]: s.labels for s in families[family].samples}


async def test_device_plugin_and_dra_gpus_get_their_pods_labels(
    fake: fakenvml.InProcessControl, kubelet: Any, tmp_path: pathlib.Path, client_dir: pathlib.Path
) -> None:
    """UUIDs, replicas and DRA gpu-<index> devices all label their GPU's series."""
    fake.reset_all()
    mon = await started(config(tmp_path, kubelet.socket, client_dir))
    try:
        u = uuids(mon.view)
        kubelet.pods = [
            ("team-a", "train-0", [("trainer", [("nvidia.com/gpu", [u[0], f"{u[1]}::2"])], [])]),
            ("team-b", "infer-1", [("server", [], [("gpu.nvidia.com", "gpu-node-1", "gpu-5")])]),
            ("kube-system", "other", [("x", [("example.com/nic", ["eth1"])], [])]),
            ("team-c", "lost", [("y", [("nvidia.com/gpu", ["GPU-99999999-1111-2222-3333-44"])],
                                 [])]),
        ]  # fmt: skip
        status = await mon.refresh_pods()
        assert status.enabled, status.detail
        assert status.detail == "3 of 8 GPUs allocated to pods"
        view = await mon.probe_once()
        temps = labelled(view, "DCGM_FI_DEV_GPU_TEMP")
        assert tuple(temps["1"][k] for k in ("namespace", "pod", "container")) == (
            "team-a",
            "train-0",
            "trainer",
        )
        assert temps["5"]["pod"] == "infer-1"
        assert "pod" not in temps["2"]
        xid = labelled(view, "DCGM_FI_DEV_XID_ERRORS")["0"]
        assert (xid["err_code"], xid["err_msg"], xid["pod"]) == ("0", "No Error", "train-0")
        assert view.pods.unmatched == ("GPU-99999999-1111-2222-3333-44",)
        assert status.client["version"] == "v0.37.2"
    finally:
        await mon.stop()


async def test_attribution_follows_pods_as_they_come_and_go(
    fake: fakenvml.InProcessControl, kubelet: Any, tmp_path: pathlib.Path, client_dir: pathlib.Path
) -> None:
    """A refresh tier of its own: the agent's own loop picks up a new allocation and its end."""
    fake.reset_all()
    cfg = config(tmp_path, kubelet.socket, client_dir)
    application = agent_app.make_app(cfg)
    async with test_utils.TestClient(test_utils.TestServer(application)) as c:

        async def gpus_until(check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
            deadline = time.monotonic() + DEADLINE_S
            while True:
                # Pod names are shown to a caller with a token only (security review 3,
                # finding 3); this agent's auth is off, so any bearer is the on-call role.
                on_call = {"Authorization": "Bearer on-call"}
                doc: dict[str, Any] = await (await c.get("/v1/gpus", headers=on_call)).json()
                if check(doc):
                    return doc
                assert time.monotonic() < deadline, doc["podAttribution"]
                await asyncio.sleep(0.05)

        doc = await gpus_until(lambda d: d["podAttribution"]["enabled"] and d["gpus"])
        uuid = doc["gpus"][3]["uuid"]
        kubelet.pods = [("team-a", "job-3", [("main", [("nvidia.com/gpu", [uuid])], [])])]
        doc = await gpus_until(lambda d: bool(d["gpus"][3]["pods"]))
        assert doc["gpus"][3]["pods"] == [
            {"namespace": "team-a", "pod": "job-3", "container": "main"}
        ]
        body = await (await c.get("/metrics", headers={"Authorization": "Bearer scrape"})).text()
        assert 'pod="job-3"' in body
        kubelet.pods = []
        await gpus_until(lambda d: not d["gpus"][3]["pods"])
        assert kubelet.calls >= 3


@pytest.mark.parametrize(
    ("setup", "detail"),
    [
        pytest.param("no-socket", "does not exist", id="without the kubelet socket it is off"),
        pytest.param("no-client", "no generated PodResources client",
                     id="without the generated client it is off"),
        pytest.param("grpcio-client", "no generated PodResources client (grpclib)",
                     id="a client an older builder made for grpcio only is not used"),
        pytest.param("not-answering", "PodResources List", id="a kubelet that does not answer"),
        pytest.param("disabled", "off by setting", id="turned off by setting"),
    ],
)  # fmt: skip
async def test_attribution_off_is_said_plainly_and_the_agent_works_on(  # noqa: PLR0917 - fixtures
    fake: fakenvml.InProcessControl,
    tmp_path: pathlib.Path,
    sock_dir: pathlib.Path,
    client_dir: pathlib.Path,
    setup: str,
    detail: str,
) -> None:
    """No socket, no client or no answer: no pod labels, the reason in /v1/gpus, GPUs probed."""
    fake.reset_all()
    sock = sock_dir / "kubelet.sock"
    client = tmp_path / "nothing-here" if setup == "no-client" else client_dir
    if setup == "grpcio-client":
        client = tmp_path / "grpcio-only"
        shutil.copytree(client_dir, client)
        (client / podresources.PACKAGE / "api_grpc.py").unlink()
    if setup == "not-answering":
        sock.write_text("")  # a file where a socket should be: connection refused
    extra = {"pod_labels": False} if setup == "disabled" else {}
    mon = await started(config(tmp_path, sock, client, **extra))
    try:
        status = await mon.refresh_pods()
        view = await mon.probe_once()
        doc = agent_app.gpus_document(view, None, dcgm_enabled=False)
        assert (status.enabled, detail in doc["podAttribution"]["detail"]) == (False, True)
        assert len(view.snapshots) == 8
        assert "pod" not in labelled(view, "DCGM_FI_DEV_GPU_TEMP")["0"]
    finally:
        await mon.stop()


# ---------------------------------------------------------------- the client against the server


def one_pod(uuid: str = "GPU-0") -> list[Any]:
    """One pod holding one device-plugin GPU."""
    return [("team-a", "job", [("main", [("nvidia.com/gpu", [uuid])], [])])]


def held(devices: list[attribution.DeviceGrant]) -> list[tuple[str, str]]:
    """(pod, device id) of each device-plugin grant."""
    return [(d.ref.pod, d.device_id) for d in devices]


async def test_a_call_the_kubelet_does_not_answer_in_time_gives_up_and_the_next_one_answers(
    kubelet: Any, client_dir: pathlib.Path
) -> None:
    """The List timeout bounds a call to a kubelet that accepted it and never answers."""
    kubelet.pods = one_pod()
    client = pr_client.Client(client_dir, kubelet.socket, timeout_s=0.2)
    try:
        kubelet.answering.clear()
        async with asyncio.timeout(DEADLINE_S):
            with pytest.raises(pr_client.PodResourcesError, match="DEADLINE_EXCEEDED"):
                await client.list()
        kubelet.answering.set()
        devices, _ = await client.list()
        assert held(devices) == [("job", "GPU-0")]
    finally:
        await client.close()


async def test_a_kubelet_answering_an_error_status_is_said_by_its_name_and_the_next_call_works(
    kubelet: Any, client_dir: pathlib.Path
) -> None:
    """A status the kubelet sends (here grpcio's) reaches `/v1/gpus` as gRPC names it."""
    kubelet.error = ("PERMISSION_DENIED", "pod resources API is disabled")
    client = pr_client.Client(client_dir, kubelet.socket, timeout_s=DEADLINE_S)
    try:
        with pytest.raises(pr_client.PodResourcesError) as caught:
            await client.list()
        assert str(caught.value).endswith(": PERMISSION_DENIED pod resources API is disabled")
        kubelet.error = None
        kubelet.pods = one_pod()
        devices, _ = await client.list()
        assert held(devices) == [("job", "GPU-0")]
    finally:
        await client.close()


MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("answer_bytes", "cap", "refused"),
    [
        pytest.param(5 * MIB, None, False,
                     id="an answer over gRPC's usual 4 MiB and under the kubelet's 16 MiB is read"),
        pytest.param(17 * MIB, None, True, id="an answer over 16 MiB is refused"),
        pytest.param(64 * 1024, 32 * 1024, True, id="an answer over a smaller cap is refused"),
    ],
)  # fmt: skip
async def test_answers_are_read_up_to_the_message_cap_and_the_next_call_works(
    kubelet: Any, client_dir: pathlib.Path, answer_bytes: int, cap: int | None, refused: bool
) -> None:
    """The cap is the kubelet's own client's (16 MiB); a refusal leaves the client usable."""
    # One device id of 40 characters costs 42 bytes in the answer.
    ids = [f"GPU-{i:036d}" for i in range(answer_bytes // 42 + 1)]
    kubelet.pods = [("team-a", "big", [("main", [("nvidia.com/gpu", ids)], [])])]
    extra = {} if cap is None else {"max_message_bytes": cap}
    client = pr_client.Client(client_dir, kubelet.socket, timeout_s=DEADLINE_S, **extra)
    try:
        if refused:
            with pytest.raises(pr_client.PodResourcesError, match="RESOURCE_EXHAUSTED"):
                await client.list()
        else:
            devices, _ = await client.list()
            assert len(ids) == len(devices)
        kubelet.pods = one_pod()
        devices, _ = await client.list()
        assert held(devices) == [("job", "GPU-0")]
    finally:
        await client.close()


@pytest.mark.parametrize(
    "call_while_down",
    [
        pytest.param(True, id="a call while the kubelet is down fails and the next one answers"),
        pytest.param(False, id="the first call after a kubelet restart answers"),
    ],
)
async def test_the_client_reconnects_after_a_kubelet_restart(
    kubelet: Any, client_dir: pathlib.Path, call_while_down: bool
) -> None:
    """A restarted kubelet replaces its socket; the same client reaches the new one."""
    kubelet.pods = one_pod()
    client = pr_client.Client(client_dir, kubelet.socket, timeout_s=DEADLINE_S)
    try:
        devices, _ = await client.list()
        assert held(devices) == [("job", "GPU-0")]
        await kubelet.stop()
        if call_while_down:
            with pytest.raises(pr_client.PodResourcesError, match="PodResources List"):
                await client.list()
        kubelet.pods = one_pod("GPU-1")
        await kubelet.start()
        devices, _ = await client.list()
        assert held(devices) == [("job", "GPU-1")]
    finally:
        await client.close()


AGENT_WITHOUT_GRPCIO = """
import asyncio, pathlib, sys
sys.modules["grpc"] = None  # `import grpc` now fails, as where grpcio is not installed
from agent import app
loaded = sorted(m for m in ("grpc", "grpclib", "h2") if sys.modules.get(m))
from agent.probing import podresources

async def main():
    client = podresources.Client(
        pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), timeout_s=30
    )
    devices, _ = await client.list()
    await client.close()
    print(loaded, [d.device_id for d in devices])

asyncio.run(main())
"""


async def test_the_agent_calls_the_kubelet_without_grpcio_and_loads_grpclib_only_to_call(
    kubelet: Any, client_dir: pathlib.Path
) -> None:
    """grpcio is a dev dependency (the stand-in kubelet): the agent's runtime never imports it,
    and importing the agent loads no gRPC library until attribution runs."""
    kubelet.pods = one_pod()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", AGENT_WITHOUT_GRPCIO, str(client_dir), str(kubelet.socket),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(DEADLINE_S):
        out, err = await proc.communicate()
    assert (proc.returncode, out.decode().strip()) == (0, "[] ['GPU-0']"), err.decode()
