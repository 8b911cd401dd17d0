"""A rerun, computed: the spec of a new run made from an old run's evidence (pure).

`POST /v1/runs/{ns}/{name}/rerun` submits the old run's spec again under a new name, with
its image pinned to the digest that ran when the evidence has one (the pods' `imageID`), so
a tag that moved since does not change what runs. The new run's TauRun carries
`taugrid.dev/rerun-of` (the old run's name, uid, spec hash and image ID), which its
evidence repeats as `rerunOf`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from controller import marks
from controller.runs import records
from shared import spec as specs

_REPO_DIGEST = re.compile(r"(?:[a-z-]+://)?(?P<repo>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})")
"""An image ID as a container runtime reports it: `repo@sha256:<hex>` (containerd, CRI-O),
`docker-pullable://repo@sha256:<hex>` (Docker); a bare `sha256:<hex>` is a local image ID,
not a digest a registry serves."""


def repository(image: str) -> str:
    """An image reference without its tag or digest (`reg:5000/img:tag` → `reg:5000/img`)."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def pinned_image(image: str, image_id: str | None) -> tuple[str, str | None]:
    """The image a rerun runs, and a warning when it could not be pinned: the spec's image
    by the digest that ran (the repository the researcher named, with the runtime's digest),
    or the spec's own image when it is pinned already or the evidence has no usable digest."""
    if "@sha256:" in image:
        return image, None
    match = _REPO_DIGEST.fullmatch(image_id or "")
    if match is None:
        why = "has no image digest" if not image_id else f"has no pullable digest ({image_id})"
        return image, (
            f"the old run's evidence {why}: the rerun runs {image!r} as given, which may not be"
            " the code that ran if the tag moved"
        )
    return f"{repository(image)}@{match['digest']}", None


def next_name(old: str, existing: Iterable[str]) -> str:
    """`<old>-r<N>`, N one more than the highest rerun of `old` there is (from 1)."""
    pattern = re.compile(re.escape(old) + r"-r(\d{1,6})")
    taken = [int(m[1]) for n in existing if (m := pattern.fullmatch(n))]
    return f"{old}-r{max(taken, default=0) + 1}"


def source(item: Mapping[str, Any], status: records.RunStatus) -> records.RerunSource:
    """What a rerun records of the run it was made from."""
    meta = item.get("metadata") or {}
    evidence = status.evidence or records.Evidence()
    return records.RerunSource(
        name=str(meta.get("name", "")), uid=str(meta.get("uid", "")),
        spec_hash=evidence.spec_hash, image_id=evidence.image_id,
    )  # fmt: skip


def annotation(src: records.RerunSource) -> str:
    """The `taugrid.dev/rerun-of` annotation's value."""
    return json.dumps(src.model_dump(mode="json", by_alias=True, exclude_none=True),
                      sort_keys=True, separators=(",", ":"))  # fmt: skip


def read_source(annotations: Mapping[str, Any]) -> records.RerunSource | None:
    """The run a TauRun reruns, from its annotation; None when it has none or it is damaged
    (someone edited it: the evidence then just does not say)."""
    raw = annotations.get(marks.RERUN_OF_ANNOTATION)
    if not isinstance(raw, str):
        return None
    try:
        return records.RerunSource.model_validate(json.loads(raw))
    except ValueError:
        return None


def validated(old_spec: Mapping[str, Any], *, name: str, image: str) -> specs.ParsedSpec:
    """The old run's spec as stored, with the new name and image, validated like a
    submission (SpecError when it is not valid)."""
    return specs.validate_spec({**old_spec, "name": name, "image": image})
