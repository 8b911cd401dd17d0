"""The fake device plugin's answers."""

from __future__ import annotations

import pytest

from devcluster import deviceplugin


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        (["GPU-a"], "GPU-a"),
        (["GPU-a", "GPU-b"], "GPU-a,GPU-b"),
    ],
    ids=["one GPU", "two GPUs, comma-separated as NVIDIA's envvar strategy"],
)
def test_allocate_names_the_devices_in_nvidia_visible_devices(
    ids: list[str], expected: str
) -> None:
    """A container gets exactly its devices' UUIDs, nothing else."""
    assert {"NVIDIA_VISIBLE_DEVICES": expected} == deviceplugin.allocate_envs(ids)
