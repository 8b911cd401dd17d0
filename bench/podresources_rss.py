"""What the agent's PodResources client costs in RSS: its import and its calls, this tree against
a baseline revision, side by side in one run.

Run: `python -m bench.podresources_rss --baseline REV [--python VENV_PY] [--baseline-python
VENV_PY]`. For each tree (the baseline's `agent` and `shared` extracted with `git archive`,
and this one), a fresh interpreter imports the agent as `python -m agent` does (`agent.app`),
then builds the PodResources client (which imports the gRPC library and the generated
modules), then makes one List call and 100 more against a PodResources server in this process
(grpcio, the kubelet's proto, 8 pods with a GPU each), reading its RSS from /proc after each
step: the whole RSS and its anonymous part (what the libraries allocate; the rest is pages of
mapped files, which move with the page cache between runs). Each tree runs `--repeat` times,
alternating, and the medians are printed. Both trees' clients read the same generated
directory (it holds grpclib's and grpcio's service modules). Give each tree the interpreter of
its own `uv sync --no-dev`, as the image: the baseline's dependency set is not this tree's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import shutil
import statistics
import sys
import tempfile

from bench import agent as agent_bench
from devcluster import podresources

REPO = pathlib.Path(__file__).resolve().parents[1]

PROBE = """
import asyncio, json, pathlib, sys

def rss_mib():
    status = pathlib.Path("/proc/self/status").read_text().splitlines()
    kib = dict(line.split(":", 1) for line in status)
    return [int(kib[k].split()[0]) / 1024 for k in ("VmRSS", "RssAnon")]

steps = {"interpreter, asyncio": rss_mib()}
from agent import app  # noqa: F401 - the agent's imports, as `python -m agent`
from agent.probing import podresources
steps["agent imported"] = rss_mib()
client = podresources.Client(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), timeout_s=30)
steps["client built (gRPC imported)"] = rss_mib()

async def main():
    devices, _ = await client.list()
    assert len(devices) == 8, devices
    steps["first List call"] = rss_mib()
    for _ in range(100):
        await client.list()
    steps["101 List calls"] = rss_mib()
    await client.close()

asyncio.run(main())
print(json.dumps(steps))
"""


async def measure(
    tree: pathlib.Path, python: str, client_dir: pathlib.Path, sock: str
) -> dict[str, list[float]]:
    """[RSS, anonymous RSS] after each step of a fresh interpreter running the client of `tree`."""
    proc = await asyncio.create_subprocess_exec(
        python, "-c", PROBE, str(client_dir), sock,
        cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    if proc.returncode != 0:
        msg = f"{tree}: exit {proc.returncode}: {err.decode()[-2000:]}"
        raise RuntimeError(msg)
    steps: dict[str, list[float]] = json.loads(out)
    return steps


def medians(runs: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    """Per step, the median of each figure over the runs."""
    return {
        step: [statistics.median(r[step][i] for r in runs) for i in range(2)] for step in runs[0]
    }


async def main(baseline: str, python: str, baseline_python: str | None, repeat: int) -> None:
    """Measure both trees, alternating, against one server; print the table."""
    client_dir = podresources.build()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-pr-", dir="/tmp"))
    kubelet = podresources.FakeKubelet(client_dir, tmp / "kubelet.sock")
    kubelet.pods = [
        ("team-a", f"train-{i}", [("trainer", [("nvidia.com/gpu", [f"GPU-{i}"])], [])])
        for i in range(8)
    ]
    await kubelet.start()
    runs: dict[str, list[dict[str, list[float]]]] = {"before": [], "after": []}
    try:
        base = agent_bench.extract(baseline, tmp / "baseline")
        sock = str(kubelet.socket)
        for _ in range(repeat):
            runs["before"].append(await measure(base, baseline_python or python, client_dir, sock))
            runs["after"].append(await measure(REPO, python, client_dir, sock))
    finally:
        await kubelet.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    before, after = medians(runs["before"]), medians(runs["after"])
    print(f"PodResources client, MiB, median of {repeat} fresh interpreters each")
    print(f"(before: {baseline} on {baseline_python or python}; after: this tree on {python}).")
    print("RSS / anonymous RSS after each step, the step's increase in brackets:")
    print(f"| step | before ({baseline}) | after | after - before |")
    print("|---|---|---|---|")
    last = {"before": [0.0, 0.0], "after": [0.0, 0.0]}
    for step in before:
        cells = []
        for name, values in (("before", before[step]), ("after", after[step])):
            grew = [v - w for v, w in zip(values, last[name], strict=True)]
            cells.append(f"{values[0]:.1f} / {values[1]:.1f} (+{grew[0]:.1f} / +{grew[1]:.1f})")
            last[name] = values
        diff = [a - b for a, b in zip(after[step], before[step], strict=True)]
        print(f"| {step} | {cells[0]} | {cells[1]} | {diff[0]:+.1f} / {diff[1]:+.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", required=True, help="git revision to measure beside")
    parser.add_argument("--python", default=sys.executable, help="interpreter of this tree")
    parser.add_argument("--baseline-python", help="interpreter of the baseline (--python if unset)")
    parser.add_argument("--repeat", type=int, default=5, help="fresh interpreters per tree")
    args = parser.parse_args()
    asyncio.run(main(args.baseline, args.python, args.baseline_python, args.repeat))
