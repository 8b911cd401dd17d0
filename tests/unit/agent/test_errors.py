"""The agent's errors are one hierarchy, as the controller's are (architecture review 3)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent import auth, errors
from agent.probing import dcgm, nvml, podresources


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: auth.AuthError(403, "x"), id="a refused caller"),
        pytest.param(lambda: dcgm.DcgmError("x"), id="a dcgmi call that failed"),
        pytest.param(lambda: nvml.NvmlUnavailableError("x"), id="NVML that cannot be used"),
        pytest.param(lambda: podresources.PodResourcesError("x"),
                     id="a kubelet that did not answer"),
    ],
)  # fmt: skip
def test_each_kind_is_an_agent_error(make: Callable[[], Exception]) -> None:
    """A caller that catches AgentError catches each kind, and nothing else is one."""
    error = make()
    with pytest.raises(errors.AgentError) as caught:
        raise error
    assert (caught.value, issubclass(ValueError, errors.AgentError)) == (error, False)
