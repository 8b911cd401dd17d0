"""A rerun, computed: the image pinned to the digest that ran, the next free name, and the
record of the run it reruns."""

from __future__ import annotations

import pytest

from controller import marks
from controller.runs import records, reruns

HEX = "d" * 64


@pytest.mark.parametrize(
    ("image", "image_id", "expected", "warns"),
    [
        pytest.param("python:3.12-slim", f"docker.io/library/python@sha256:{HEX}",
                     f"python@sha256:{HEX}", False,
                     id="a tag is pinned to the digest the runtime reported"),
        pytest.param("reg:5000/team/img:v2", f"docker-pullable://reg:5000/team/img@sha256:{HEX}",
                     f"reg:5000/team/img@sha256:{HEX}", False,
                     id="a registry with a port, and Docker's image ID form"),
        pytest.param(f"reg/img@sha256:{'e' * 64}", f"reg/img@sha256:{HEX}",
                     f"reg/img@sha256:{'e' * 64}", False, id="an image pinned already stays"),
        pytest.param("img:v1", f"sha256:{HEX}", "img:v1", True,
                     id="a local image ID is no registry digest: kept as given, with a warning"),
        pytest.param("img:v1", None, "img:v1", True, id="no image ID: kept, with a warning"),
        pytest.param("img", f"img@sha256:{HEX}\n", "img", True,
                     id="an image ID with a trailing newline is not read as one"),
    ],
)  # fmt: skip
def test_the_image_a_rerun_runs(
    image: str, image_id: str | None, expected: str, warns: bool
) -> None:
    """The repository the researcher named, with the digest that ran when there is one."""
    got, warning = reruns.pinned_image(image, image_id)
    assert (expected, warns) == (got, warning is not None)


def test_the_next_name_counts_past_the_highest_rerun() -> None:
    """`<name>-r<N>`: one more than the highest there is, whatever else is named alike."""
    assert reruns.next_name("ft", ["ft", "ft-r1", "ft-r3", "ft-rx", "ft-r2-r1", "other-r9"]) == (
        "ft-r4"
    )
    assert reruns.next_name("ft", []) == "ft-r1"


def test_the_source_reads_back_from_its_annotation_and_damage_reads_as_none() -> None:
    """What the new TauRun's annotation carries is what its evidence says; an edited,
    unreadable annotation is just not said."""
    src = records.RerunSource(name="ft", uid="u", spec_hash="sha256:1", image_id=f"i@sha256:{HEX}")
    assert reruns.read_source({marks.RERUN_OF_ANNOTATION: reruns.annotation(src)}) == src
    assert reruns.read_source({marks.RERUN_OF_ANNOTATION: "{not json"}) is None
    assert reruns.read_source({}) is None
