"""The agent's errors under one base, as the controller's are under `ControllerError`.

Each kind keeps its own name and meaning where it is raised: `auth.AuthError` (a caller
refused: the handlers answer 401 or 403), `probing.dcgm.DcgmError` (a dcgmi call failed or
printed what cannot be read), `probing.nvml.NvmlUnavailableError` (NVML cannot be used at
all) and `probing.podresources.PodResourcesError` (the kubelet's PodResources API did not
answer). One base lets a caller that only needs "the agent failed, not a bug" say so once.
"""

from __future__ import annotations


class AgentError(Exception):
    """Base of every error the agent raises on purpose."""
