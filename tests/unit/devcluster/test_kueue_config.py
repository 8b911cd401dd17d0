"""Kueue's configuration on the dev cluster follows the Kueue version it runs."""

from __future__ import annotations

import pytest

from devcluster import build, cluster


@pytest.mark.parametrize(
    ("version", "gate"),
    [
        pytest.param("v0.17.0", "DynamicResourceAllocation", id="v0.17: its alpha gate"),
        pytest.param("v0.17.1", "DynamicResourceAllocation", id="v0.17.1: the same"),
        pytest.param("v0.18.4", "KueueDRAIntegration", id="v0.18: renamed, old name locked off"),
        pytest.param("v0.19.2", "KueueDRAIntegration", id="v0.19: only the new name"),
    ],
)  # fmt: skip
def test_the_dra_gate_is_named_as_the_version_names_it(version: str, gate: str) -> None:
    """Each version gets the DRA gate it knows, on; an unknown gate would stop Kueue."""
    gates = cluster.kueue_feature_gates(version, visibility=False)
    assert gates == {"VisibilityOnDemand": False, gate: True}


def test_every_known_version_gets_a_dra_gate() -> None:
    """No version the build accepts is left without DRA quota counting."""
    for version in build.KUEUE_VERSIONS:
        gates = cluster.kueue_feature_gates(version, visibility=True)
        assert {"DynamicResourceAllocation", "KueueDRAIntegration"} & {
            g for g, on in gates.items() if on
        }
