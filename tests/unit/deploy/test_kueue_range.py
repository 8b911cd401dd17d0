"""The Kueue range the chart states is the one the dev cluster builds and the docs give."""

from __future__ import annotations

import pathlib

import yaml

from devcluster import build

REPO = pathlib.Path(__file__).resolve().parents[3]
CHART = REPO / "deploy" / "helm" / "taugrid" / "Chart.yaml"
PLATFORM = REPO / "docs" / "platform.md"


def _annotations() -> dict[str, str]:
    data = yaml.safe_load(CHART.read_text())
    return dict(data["annotations"])


def _minor(version: str) -> tuple[int, int, int]:
    major, minor, patch = version.removeprefix("v").split(".")
    return int(major), int(minor), int(patch)


def test_the_chart_names_the_floor_the_dev_cluster_can_build() -> None:
    """The stated minimum is the oldest version `TAUGRID_KUEUE_VERSION` accepts."""
    floor = min(build.KUEUE_VERSIONS, key=_minor)
    assert _annotations()["taugrid.dev/kueue-min-version"] == floor
    assert f"Kueue >= {floor.rsplit('.', 1)[0]}" in _annotations()["taugrid.dev/requires"]


def test_the_chart_says_tested_only_of_versions_the_dev_cluster_builds() -> None:
    """Every version called tested is buildable here, and the pinned one is among them."""
    tested = [v.strip() for v in _annotations()["taugrid.dev/kueue-tested-versions"].split(",")]
    assert build.KUEUE_VERSION in tested
    assert set(tested) <= set(build.KUEUE_VERSIONS)


def test_the_platform_page_states_the_same_range() -> None:
    """docs/platform.md names the pinned version and the floor in its Kueue table."""
    text = PLATFORM.read_text()
    assert "### Kueue versions" in text
    for version in _annotations()["taugrid.dev/kueue-tested-versions"].split(","):
        assert f"| **{version.strip()}**" in text or f"| {version.strip()} |" in text, version
