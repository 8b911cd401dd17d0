"""One image spec (deploy/docker/images.yaml) makes both the published Dockerfiles and the
dev cluster's local images, so entry point, user, port, paths and Python cannot drift."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import yaml

from devcluster import images, imagespec

SPEC = imagespec.load()
PROJECT = imagespec.Project.read()
PUBLISHED = imagespec.published(SPEC)


@pytest.mark.parametrize("name", PUBLISHED)
def test_the_committed_dockerfile_is_the_generated_one(name: str) -> None:
    """`taugrid dev dockerfiles` would change nothing: the committed file is the spec's."""
    committed = (imagespec.DOCKER_DIR / f"{name}.Dockerfile").read_text()
    assert imagespec.dockerfile(SPEC, name, PROJECT) == committed


def test_the_published_images_are_the_controller_and_the_agent() -> None:
    """The dev-only run image has no Dockerfile; the two published ones do."""
    assert PUBLISHED == ["controller", "agent"]
    with pytest.raises(imagespec.SpecError, match="dev-only"):
        imagespec.dockerfile(SPEC, "run", PROJECT)


def _config(name: str) -> dict[str, Any]:
    config = images.oci_config(SPEC, SPEC.image(name), ["0" * 64])["config"]
    assert isinstance(config, dict)
    return config


@pytest.mark.parametrize("name", PUBLISHED)
def test_the_local_image_config_says_what_the_dockerfile_says(name: str) -> None:
    """ENTRYPOINT, USER, EXPOSE and ENV of the Dockerfile are the local image's config."""
    text = (imagespec.DOCKER_DIR / f"{name}.Dockerfile").read_text()
    config = _config(name)
    entry = ", ".join(f'"{w}"' for w in config["Entrypoint"])
    assert f"ENTRYPOINT [{entry}]" in text
    assert f"USER {config['User']}" in text
    assert [f"EXPOSE {p.split('/')[0]}" for p in config["ExposedPorts"]] == [
        line for line in text.splitlines() if line.startswith("EXPOSE ")
    ]
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["VIRTUAL_ENV"] == SPEC.venv
    assert env["PATH"].startswith(f"{SPEC.venv}/bin:")
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert f"ARG PYTHON_IMAGE=python:{SPEC.python}-slim-{SPEC.debian}" in text


def test_the_spec_python_is_the_one_of_the_debian_release() -> None:
    """bookworm's python3 is 3.11: the local build's interpreter is the Dockerfile's version."""
    assert (SPEC.debian, SPEC.python) == ("bookworm", "3.11")


def _raw() -> dict[str, Any]:
    data = yaml.safe_load(imagespec.SPEC_PATH.read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(lambda d: d.update(extra=1), "unknown field", id="an unknown top field"),
        pytest.param(lambda d: d.pop("venv"), "missing field", id="a missing top field"),
        pytest.param(
            lambda d: d["images"]["agent"].update(colour="red"),
            r"images\.agent: .*colour|unknown field\(s\) in images\.agent",
            id="an unknown image field",
        ),
        pytest.param(
            lambda d: d["images"]["agent"].pop("entrypoint"), "images.agent", id="no entrypoint"
        ),
    ],
)
def test_a_malformed_spec_is_refused_naming_the_field(change: Any, message: str) -> None:
    """The spec is checked as strictly as a tau.yaml: unknown and missing fields are named."""
    data = _raw()
    change(data)
    with pytest.raises(imagespec.SpecError, match=message):
        imagespec.parse(data)


def test_an_image_drops_the_console_scripts_of_packages_it_leaves_out() -> None:
    """The console scripts whose package an image leaves out are removed from its venv."""
    agent = SPEC.image("agent")
    assert PROJECT.dropped_scripts(agent) == ["tau", "taugrid", "taugrid-controller"]
    assert PROJECT.absent_packages(agent) == ["controller", "devcluster"]


def test_writing_the_dockerfiles_reports_what_changed(tmp_path: pathlib.Path) -> None:
    """Into an empty directory every published Dockerfile is new; a second write changes none."""
    first = imagespec.write_dockerfiles(SPEC, tmp_path)
    assert sorted(str(tmp_path / f"{n}.Dockerfile") for n in PUBLISHED) == sorted(first)
    assert imagespec.write_dockerfiles(SPEC, tmp_path) == []
