"""The image spec (`deploy/docker/images.yaml`) and the Dockerfiles it generates.

Pure: reading the spec and rendering text. `devcluster.images` builds the same images
without Docker from the same spec, so entry point, user, port, paths, environment, labels and
the Python version of the published images and of the dev cluster's cannot drift.
"""

from __future__ import annotations

import dataclasses
import pathlib
import tomllib
from collections.abc import Mapping
from typing import Any

import yaml

REPO = pathlib.Path(__file__).resolve().parent.parent
SPEC_PATH = REPO / "deploy" / "docker" / "images.yaml"
DOCKER_DIR = SPEC_PATH.parent


class SpecError(Exception):
    """The image spec is malformed; the message names the field."""


@dataclasses.dataclass(frozen=True)
class Image:
    """One image of the spec."""

    name: str
    title: str
    description: str
    packages: tuple[str, ...]
    entrypoint: tuple[str, ...]
    user: int
    port: int
    account: str
    published: bool = True
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    podresources_client: str = ""
    """Where the generated kubelet PodResources client goes (`devcluster/podresources.py`);
    the local build only so far: the published Dockerfile does not generate it yet."""
    summary: str = ""
    build_notes: str = ""
    pin_notes: str = ""
    bytecode_note: str = ""
    published_only: str = ""
    readonly_note: str = ""
    user_note: str = ""
    port_note: str = ""


@dataclasses.dataclass(frozen=True)
class Spec:
    """Every image, and what they share."""

    python: str
    debian: str
    python_image: str
    uv_version: str
    venv: str
    version: str
    env: Mapping[str, str]
    licenses: str
    debian_packages: tuple[str, ...]
    images: Mapping[str, Image]

    def image(self, name: str) -> Image:
        """Return one image, or raise naming the known ones."""
        try:
            return self.images[name]
        except KeyError:
            msg = f"no image {name!r} in the spec (images: {', '.join(self.images)})"
            raise SpecError(msg) from None


_STR_FIELDS = ("python", "debian", "python_image", "uv_version", "venv", "version", "licenses")


def parse(data: Any) -> Spec:
    """Build the spec from its parsed YAML, refusing unknown or missing fields."""
    if not isinstance(data, dict):
        msg = "the image spec must be a mapping"
        raise SpecError(msg)
    known = {*_STR_FIELDS, "env", "debian_packages", "images"}
    unknown = sorted(set(data) - known)
    if unknown:
        msg = f"unknown field(s) in the image spec: {', '.join(unknown)}"
        raise SpecError(msg)
    missing = sorted(known - set(data))
    if missing:
        msg = f"missing field(s) in the image spec: {', '.join(missing)}"
        raise SpecError(msg)
    image_fields = {f.name for f in dataclasses.fields(Image)} - {"name"}
    images: dict[str, Image] = {}
    for name, raw in (data["images"] or {}).items():
        if not isinstance(raw, dict):
            msg = f"images.{name} must be a mapping"
            raise SpecError(msg)
        bad = sorted(set(raw) - image_fields)
        if bad:
            msg = f"unknown field(s) in images.{name}: {', '.join(bad)}"
            raise SpecError(msg)
        try:
            images[name] = Image(
                name=name,
                **{
                    **raw,
                    "packages": tuple(raw.get("packages") or ()),
                    "entrypoint": tuple(raw["entrypoint"]),
                    "files": dict(raw.get("files") or {}),
                    "user": int(raw["user"]),
                    "port": int(raw["port"]),
                },
            )
        except (KeyError, TypeError, ValueError) as err:
            msg = f"images.{name}: {err}"
            raise SpecError(msg) from err
    return Spec(
        **{k: str(data[k]) for k in _STR_FIELDS},
        env={str(k): str(v) for k, v in data["env"].items()},
        debian_packages=tuple(data["debian_packages"]),
        images=images,
    )


def load(path: pathlib.Path = SPEC_PATH) -> Spec:
    """Read the committed spec."""
    return parse(yaml.safe_load(path.read_text()))


@dataclasses.dataclass(frozen=True)
class Project:
    """What the Dockerfiles need from pyproject.toml."""

    wheel_packages: tuple[str, ...]
    scripts: Mapping[str, str]

    @classmethod
    def read(cls, root: pathlib.Path = REPO) -> Project:
        """Read the wheel packages and console scripts of the project."""
        data = tomllib.loads((root / "pyproject.toml").read_text())
        return cls(
            tuple(data["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]),
            dict(data["project"]["scripts"]),
        )

    def dropped_scripts(self, image: Image) -> list[str]:
        """Console scripts whose package the image does not carry (removed from its venv)."""
        return sorted(
            name
            for name, target in self.scripts.items()
            if target.split(":")[0].split(".")[0] not in image.packages
        )

    def absent_packages(self, image: Image) -> list[str]:
        """Wheel packages the image leaves out, in pyproject's order."""
        return [p for p in self.wheel_packages if p not in image.packages]


def _comment(text: str) -> list[str]:
    return [f"# {line}".rstrip() for line in text.splitlines()] if text else []


def _labels(spec: Spec, image: Image) -> list[str]:
    pairs = [
        ("title", f'"{image.title}"'),
        ("description", f'"{image.description}"'),
        ("version", '"${VERSION}"'),
        ("revision", '"${REVISION}"'),
        ("source", '"${SOURCE}"'),
        ("licenses", f'"{spec.licenses}"'),
        ("base.name", '"${PYTHON_IMAGE}"'),
    ]
    lines = [f"org.opencontainers.image.{k}={v}" for k, v in pairs]
    return [
        ("LABEL " if i == 0 else "      ") + line + (" \\" if i < len(lines) - 1 else "")
        for i, line in enumerate(lines)
    ]


def labels(spec: Spec, image: Image, *, revision: str = "unknown") -> dict[str, str]:
    """The OCI labels of an image, as the Dockerfile's LABEL sets them (local build values)."""
    return {
        "org.opencontainers.image.title": image.title,
        "org.opencontainers.image.description": image.description,
        "org.opencontainers.image.version": spec.version,
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.source": "",
        "org.opencontainers.image.licenses": spec.licenses,
        "org.opencontainers.image.base.name": f"debian:{spec.debian} (mmdebstrap) + python3",
    }


def _env(spec: Spec) -> list[str]:
    items = list(spec.env.items())
    return [
        ("ENV " if i == 0 else "    ") + f"{k}={v}" + (" \\" if i < len(items) - 1 else "")
        for i, (k, v) in enumerate(items)
    ]


def _account(image: Image) -> list[str]:
    if not image.account:
        return []
    uid = image.user
    return [
        (
            f"# A named account for the chart's runAsUser/runAsGroup {uid} "
            '(distroless\'s "nonroot"),'
            " so"
        ),
        "# tools that look the user up find one; it owns nothing in the image.",
        f"RUN groupadd --system --gid {uid} {image.account} \\",
        f"    && useradd --system --uid {uid} --gid {uid} --no-create-home \\",
        f"       --home-dir /nonexistent --shell /usr/sbin/nologin {image.account}",
    ]


def dockerfile(spec: Spec, name: str, project: Project) -> str:
    """Render one image's published Dockerfile from the spec."""
    image = spec.image(name)
    if not image.published:
        msg = f"image {name!r} is dev-only (published: false): it has no Dockerfile"
        raise SpecError(msg)
    py = f"python{spec.python}"
    venv = spec.venv
    absent = ", ".join(project.absent_packages(image))
    dropped = " ".join(f"{venv}/bin/{s}" for s in project.dropped_scripts(image))
    out: list[str] = ["# syntax=docker/dockerfile:1"]
    out += _comment(image.summary)
    out += [
        "#",
        "# Build from the repository root (the context must hold pyproject.toml and uv.lock):",
        (
            f'#   docker build -f deploy/docker/{name}.Dockerfile -t "$REGISTRY/taugrid/{name}:'
            f'{spec.version}" .'
        ),
    ]
    out += _comment(image.build_notes)
    out += [
        "#",
        (
            "# Pin both base images by digest in CI,"
            " so a rebuild of the same commit gives the same "
            "image:"
        ),
        f"#   --build-arg PYTHON_IMAGE={spec.python_image}@sha256:<digest>",
        f"#   --build-arg UV_IMAGE=ghcr.io/astral-sh/uv:{spec.uv_version}@sha256:<digest>",
    ]
    out += _comment(image.pin_notes)
    out += [
        "# The builder and the runtime must use the same PYTHON_IMAGE: the virtual environment's",
        f"# interpreter is a link to /usr/local/bin/{py} of that image.",
        f"ARG PYTHON_IMAGE={spec.python_image}",
        f"ARG UV_IMAGE=ghcr.io/astral-sh/uv:{spec.uv_version}",
        "",
        "FROM ${UV_IMAGE} AS uv",
        "",
        "# ---------------------------------------------------------------- builder",
        "FROM ${PYTHON_IMAGE} AS builder",
        "COPY --from=uv /uv /usr/local/bin/uv",
    ]
    out += _comment(image.bytecode_note)
    out += [
        (
            "# UV_PYTHON_DOWNLOADS=never keeps uv on the image's interpreter;"
            " a uv-managed one would "
            "live"
        ),
        "# outside the copied environment.",
        "ENV UV_COMPILE_BYTECODE=1 \\",
        "    UV_LINK_MODE=copy \\",
        "    UV_PYTHON_DOWNLOADS=never \\",
        f"    UV_PYTHON={py} \\",
        f"    UV_PROJECT_ENVIRONMENT={venv}",
        "WORKDIR /src",
        "# The dependencies alone first: this layer is rebuilt only when the lock changes.",
        "RUN --mount=type=cache,target=/root/.cache/uv \\",
        "    --mount=type=bind,source=pyproject.toml,target=pyproject.toml \\",
        "    --mount=type=bind,source=uv.lock,target=uv.lock \\",
        "    uv sync --frozen --no-dev --no-editable --no-install-project",
        (
            "# Then the project, as a wheel ("
            "not editable), built from only the packages this image "
            "runs:"
        ),
        f"# hatchling skips the wheel packages that are absent ({absent}).",
        "COPY pyproject.toml uv.lock README.md ./",
        *(f"COPY {p}/ {p}/" for p in image.packages),
        "# The wheel declares every console script; drop the two whose packages are not here.",
        "RUN --mount=type=cache,target=/root/.cache/uv \\",
        "    uv sync --frozen --no-dev --no-editable \\",
        f"    && rm -f {dropped}",
        "",
        "# ---------------------------------------------------------------- runtime",
        "FROM ${PYTHON_IMAGE} AS runtime",
        "ARG PYTHON_IMAGE",
        f"ARG VERSION={spec.version}",
        "ARG REVISION=unknown",
        'ARG SOURCE=""',
    ]
    if image.published_only:
        for line in image.published_only.splitlines():
            out += _labels(spec, image) if line == "@LABELS@" else [line]
    else:
        out += _labels(spec, image)
    out += _account(image)
    out += [f"COPY --from=builder {venv} {venv}"]
    out += _comment(image.readonly_note)
    out += _env(spec)
    out += _comment(image.user_note)
    out += [f"USER {image.user}:{image.user}"]
    out += _comment(image.port_note)
    out += [
        f"EXPOSE {image.port}",
        "# No HEALTHCHECK: Kubernetes probes /healthz and /readyz.",
        f"ENTRYPOINT [{', '.join(chr(34) + w + chr(34) for w in image.entrypoint)}]",
    ]
    return "\n".join(out) + "\n"


def published(spec: Spec) -> list[str]:
    """Names of the images that have a published Dockerfile."""
    return [name for name, image in spec.images.items() if image.published]


def write_dockerfiles(spec: Spec | None = None, directory: pathlib.Path = DOCKER_DIR) -> list[str]:
    """Write every published Dockerfile; return the paths that changed."""
    spec = spec or load()
    project = Project.read()
    changed = []
    for name in published(spec):
        path = directory / f"{name}.Dockerfile"
        text = dockerfile(spec, name, project)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed.append(str(path))
    return changed
