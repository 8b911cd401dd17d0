"""The nvidia-ml-py floor in pyproject.toml is the oldest release the agent works with.

The floor version is installed with uv into a scratch directory put first on a child's
PYTHONPATH (the project's other dependencies come from the venv); the child imports the agent,
reads every tier of a fake GPU and receives an Xid (`pynvml_smoke.py`). The release before the
floor must fail at import, naming what it lacks: so the floor is not merely one that works.
uv fetches from PyPI (or its cache), as `uv sync` does.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

from devcluster import fakenvml

REPO = pathlib.Path(__file__).resolve().parents[3]
SMOKE = pathlib.Path(__file__).with_name("pynvml_smoke.py")
PREVIOUS = "11.495.46"
"""The nvidia-ml-py release just before the floor on PyPI (its pynvml has no nvmlMemory_v2)."""


def declared_floor() -> str:
    """The `nvidia-ml-py>=X` of pyproject.toml's dependencies."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (spec,) = [d for d in project["dependencies"] if d.startswith("nvidia-ml-py")]
    match = re.fullmatch(r"nvidia-ml-py>=([0-9.]+)", spec)
    assert match is not None, f"pyproject.toml: {spec!r} is not a plain floor"
    return match.group(1)


def install(version: str, target: pathlib.Path) -> None:
    """Install one nvidia-ml-py release (its only module, pynvml) into `target`."""
    uv = shutil.which("uv")
    assert uv is not None, "uv is needed to install the floor version (scripts/lib.sh installs it)"
    done = subprocess.run(
        [uv, "pip", "install", "--quiet", "--no-deps", "--target", str(target),
         f"nvidia-ml-py=={version}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"uv could not install nvidia-ml-py {version}: {done.stderr}"


def smoke(target: pathlib.Path, lib: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """Run the agent's NVML paths in a child whose pynvml comes from `target`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(REPO)])}
    return subprocess.run(
        [sys.executable, str(SMOKE), str(lib)],
        capture_output=True, text=True, timeout=120, check=False, env=env, cwd=REPO,
    )  # fmt: skip


@pytest.fixture(scope="module")
def lib() -> pathlib.Path:
    """The fake NVML library."""
    return fakenvml.build()


def test_the_floor_release_runs_the_agent(lib: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """At the floor the agent imports, reads v2 memory, field values, NVLinks and events."""
    floor = declared_floor()
    install(floor, tmp_path)
    done = smoke(tmp_path, lib)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["pynvml"].startswith(str(tmp_path)), "the child did not use the floor's pynvml"
    expected = {"error": None, "memory_version": 2, "fb_reserved_mib": 543.0,
                "recovery_action": 0, "links": 18, "xid": [79]}  # fmt: skip
    assert expected == {k: seen[k] for k in expected}


def test_the_release_before_the_floor_does_not(lib: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """One release older and the agent refuses to import, naming what pynvml lacks."""
    assert tuple(map(int, PREVIOUS.split("."))) < tuple(map(int, declared_floor().split(".")))
    install(PREVIOUS, tmp_path)
    done = smoke(tmp_path, lib)
    assert done.returncode != 0
    assert "has no attribute 'nvmlMemory_v2'" in done.stderr
