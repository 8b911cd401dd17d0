"""What `taugrid dev up` prints last: the README quickstart's `tau` lines, not curl."""

from __future__ import annotations

import pathlib

import pytest

from devcluster import cli, node

URL = "http://127.0.0.1:8080"
TOKEN_FILE = pathlib.Path("/state/researcher.token")
KUBECTL = pathlib.Path("/cache/bin/kubectl")


def test_with_the_real_node_the_welcome_names_the_run_image_and_the_tau_quickstart() -> None:
    """The welcome says which image runs there and gives tau login/run/status/logs/results
    with the token file, and no curl POST."""
    text = cli.welcome_text(URL, TOKEN_FILE, node.RUN_IMAGE_ALIAS, KUBECTL)
    assert node.RUN_IMAGE_ALIAS in text
    assert f"tau login --url {URL} --token - < {TOKEN_FILE}" in text
    for line in ("tau run examples/real-node.yaml --generate-name", "tau status NAME --wait",
                 "tau logs NAME", "tau results NAME"):  # fmt: skip
        assert line in text
    assert "curl" not in text


@pytest.mark.parametrize("run_image", [""], ids=["without the real node"])
def test_without_the_real_node_the_welcome_says_a_kwok_run_executes_no_code(
    run_image: str,
) -> None:
    """Without the real node the first run is the KWOK example, said to execute nothing."""
    text = cli.welcome_text(URL, TOKEN_FILE, run_image, KUBECTL)
    assert "examples/job.yaml" in text
    assert "executes no code" in text
    assert "real-node.yaml" not in text
    assert "no real node" in text
