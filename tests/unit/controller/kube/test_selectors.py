"""Label and field selectors answered in memory, as the API server answers them."""

from __future__ import annotations

from typing import Any

import pytest

from controller.kube import selectors

LABELS = {"taugrid.dev/run": "demo", "taugrid.dev/attempt": "2", "tier": ""}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        pytest.param("", True, id="an empty selector selects everything"),
        pytest.param("taugrid.dev/run", True, id="a bare key selects objects carrying it"),
        pytest.param("other", False, id="a bare key refuses objects without it"),
        pytest.param("taugrid.dev/run=demo", True, id="key=value selects that value"),
        pytest.param("taugrid.dev/run==demo", True, id="key==value is key=value"),
        pytest.param("taugrid.dev/run=other", False, id="key=value refuses another value"),
        pytest.param("other=demo", False, id="key=value refuses an object without the key"),
        pytest.param("tier=", True, id="key= selects an empty value"),
        pytest.param("taugrid.dev/run!=other", True, id="key!=value selects another value"),
        pytest.param("taugrid.dev/run!=demo", False, id="key!=value refuses that value"),
        pytest.param("other!=demo", True, id="key!=value selects an object without the key"),
        pytest.param("!other", True, id="!key selects objects without it"),
        pytest.param("!taugrid.dev/run", False, id="!key refuses objects carrying it"),
        pytest.param("taugrid.dev/run=demo,taugrid.dev/attempt=2", True,
                     id="every comma-separated term must hold and here all do"),
        pytest.param("taugrid.dev/run=demo,taugrid.dev/attempt=3", False,
                     id="one term that fails refuses the object"),
    ],
)  # fmt: skip
def test_a_label_selector_selects_as_the_api_server_does(selector: str, expected: bool) -> None:
    """Each equality-based form holds exactly where the API server would select the object."""
    assert expected == selectors.matches(selector, LABELS)


@pytest.mark.parametrize(
    "selector",
    [
        pytest.param("env in (a,b)", id="a set-based in term"),
        pytest.param("env notin (a)", id="a set-based notin term"),
        pytest.param("a=b,,c", id="an empty term between commas"),
        pytest.param("=b", id="a term without a key"),
        pytest.param("a=b=c", id="a value with an operator in it"),
        pytest.param("a>1", id="a comparison"),
        pytest.param("a = b", id="spaces inside a term (listed, not guessed at)"),
    ],
)  # fmt: skip
def test_a_form_only_the_api_server_answers_is_refused(selector: str) -> None:
    """Forms the cache does not understand raise, so the caller lists instead of guessing."""
    with pytest.raises(selectors.UnsupportedError):
        selectors.parse(selector)


POD: dict[str, Any] = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1"}}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        pytest.param("", True, id="an empty field selector selects everything"),
        pytest.param("spec.nodeName=n1", True, id="the pod's node selects it"),
        pytest.param("spec.nodeName==n1", True, id="== is ="),
        pytest.param("spec.nodeName=n2", False, id="another node refuses it"),
        pytest.param("metadata.namespace=ns,metadata.name=p", True,
                     id="namespace and name together select it"),
        pytest.param("metadata.name=q", False, id="another name refuses it"),
    ],
)  # fmt: skip
def test_a_field_selector_selects_by_the_fields_named(selector: str, expected: bool) -> None:
    """An equality field selector holds where every named field has the value."""
    assert expected == selectors.fields_hold(selectors.parse_fields(selector), POD)


@pytest.mark.parametrize(
    "selector",
    [
        pytest.param("spec.nodeName!=n1", id="an inequality"),
        pytest.param("status.phase=Running", id="a path the cache does not answer"),
        pytest.param("spec.nodeName", id="a term without a value"),
    ],
)  # fmt: skip
def test_a_field_selector_the_cache_cannot_answer_is_refused(selector: str) -> None:
    """An inequality or an unknown path raises, so the caller lists from the API server."""
    with pytest.raises(selectors.UnsupportedError):
        selectors.parse_fields(selector)
