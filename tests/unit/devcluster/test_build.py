"""The control-plane build: stamps decide what is rebuilt, prerequisites fail early."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from devcluster import build


def _component(**changes: object) -> build.Component:
    base = build.Component("demo", ("demo",), ("v1.0.0",), lambda b: None)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"inputs": ("v1.0.1",)}, id="a version bump changes the stamp"),
        pytest.param({"binaries": ("demo", "demo2")}, id="a new binary changes the stamp"),
        pytest.param({"name": "other"}, id="another component has another stamp"),
    ],
)
def test_the_component_stamp_covers_what_determines_its_output(change: dict[str, object]) -> None:
    """Anything that changes a component's output changes its stamp, so it is rebuilt."""
    assert build.component_stamp(_component()) != build.component_stamp(_component(**change))


def test_the_stamp_is_stable_for_the_same_inputs() -> None:
    """The same inputs give the same stamp, so CI reuses the cache."""
    assert build.component_stamp(_component()) == build.component_stamp(_component())
    assert (
        build.Builder(pathlib.Path("/nonexistent")).stamp == build.Builder(pathlib.Path("/x")).stamp
    )


def test_a_component_is_built_only_when_its_marker_holds_its_stamp(tmp_path: pathlib.Path) -> None:
    """A marker with another stamp, or a missing binary, means "build again"."""
    b = build.Builder(tmp_path)
    comp = b.components[1]
    b.bin.mkdir(parents=True)
    assert not b.is_built(comp)
    for name in comp.binaries:
        (b.bin / name).write_text("")
    (b.bin / f".built-{comp.name}").write_text("stale-stamp\n")
    assert not b.is_built(comp)
    (b.bin / f".built-{comp.name}").write_text(build.component_stamp(comp) + "\n")
    assert b.is_built(comp)
    (b.bin / comp.binaries[0]).unlink()
    assert not b.is_built(comp)


@pytest.mark.parametrize("tool", ["go", "gcc"], ids=["missing go", "missing gcc"])
def test_a_missing_prerequisite_fails_at_once_saying_what_to_install(
    tool: str, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """Without go or gcc on PATH the check fails with a message naming what to install."""
    import shutil

    for other in {"go", "gcc", "openssl"} - {tool}:
        found = shutil.which(other)
        if found:
            (tmp_path / other).symlink_to(found)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(build.PrerequisiteError) as err:
        build.check_prerequisites()
    assert f"{tool}: install" in str(err.value)


def test_built_dir_refuses_an_unbuilt_cache_and_says_how_to_build(tmp_path: pathlib.Path) -> None:
    """Starting a cluster from an empty cache names the command that builds it."""
    with pytest.raises(build.BuildError) as err:
        build.built_dir(tmp_path)
    assert "taugrid dev build" in str(err.value)


def _built_elsewhere(root: pathlib.Path, comp: build.Component, stamp: str) -> pathlib.Path:
    other = root / "cluster" / "0ther" / "bin"
    other.mkdir(parents=True)
    for name in comp.binaries:
        (other / name).write_text(f"{name} built earlier")
    (other / f".built-{comp.name}").write_text(stamp + "\n")
    return other


@pytest.mark.parametrize(
    ("same_stamp", "reused"),
    [(True, True), (False, False)],
    ids=["a component built with the same stamp is copied", "another stamp is rebuilt"],
)
def test_a_component_is_reused_from_another_stamp_directory(
    tmp_path: pathlib.Path, same_stamp: bool, reused: bool
) -> None:
    """Adding a component changes the stamp directory; the others are copied from the one
    that built them with the same component stamp, not rebuilt."""
    b = build.Builder(tmp_path)
    comp = next(c for c in b.components if c.name == "etcd")
    stamp = build.component_stamp(comp) if same_stamp else "another-stamp"
    _built_elsewhere(tmp_path, comp, stamp)
    b.bin.mkdir(parents=True)
    assert reused == b.reuse(comp)
    expected = ["etcd built earlier"] if reused else []
    assert expected == [(b.bin / n).read_text() for n in comp.binaries if (b.bin / n).exists()]


def test_the_real_node_components_are_in_the_build() -> None:
    """The kubelet comes with the Kubernetes set; containerd (with its shim and ctr), our pause
    program and the device-plugin API are components of their own."""
    comps = {c.name: c for c in build.Builder(pathlib.Path("/nonexistent")).components}
    assert "kubelet" in comps["kubernetes"].binaries
    assert comps["containerd"].binaries == ("containerd", "containerd-shim-runc-v2", "ctr")
    assert comps["pause"].binaries == ("pause",)
    assert comps["kubelet-api"].assets == ("deviceplugin",)


def test_kueue_defaults_to_the_pinned_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without TAUGRID_KUEUE_VERSION the dev cluster builds the pinned (newest served) Kueue."""
    monkeypatch.delenv("TAUGRID_KUEUE_VERSION", raising=False)
    assert build.kueue_version() == build.KUEUE_VERSION
    assert build.KUEUE_VERSION in build.KUEUE_VERSIONS


def test_another_kueue_version_has_its_own_stamp(monkeypatch: pytest.MonkeyPatch) -> None:
    """TAUGRID_KUEUE_VERSION=v0.17.0 builds the floor into a cache directory of its own, so
    switching back and forth rebuilds nothing and never mixes the two."""
    monkeypatch.delenv("TAUGRID_KUEUE_VERSION", raising=False)
    pinned = build.Builder(pathlib.Path("/x"))
    monkeypatch.setenv("TAUGRID_KUEUE_VERSION", "v0.17.0")
    floor = build.Builder(pathlib.Path("/x"))
    assert build.versions()["kueue"] == "v0.17.0"
    assert floor.stamp != pinned.stamp
    kueue = {c.name: c for c in floor.components}["kueue"]
    assert "v0.17.0" in kueue.inputs


@pytest.mark.parametrize("value", ["v0.20.0", "0.19.2", "latest"])
def test_an_unknown_kueue_version_is_refused_naming_the_known_ones(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version outside the known list fails at once, listing the ones that build."""
    monkeypatch.setenv("TAUGRID_KUEUE_VERSION", value)
    with pytest.raises(build.BuildError, match=r"must be one of v0\.17\.0, .*v0\.19\.2, not"):
        build.kueue_version()
