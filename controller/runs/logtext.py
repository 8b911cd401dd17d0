"""What a researcher reads when a worker's log cannot be streamed (pure).

The API server answers a log request it cannot serve with a `Status` object (a JSON body);
`tau logs` should print a sentence, not that body, and exit with the code of what happened: a
container that has no log (a pod on a node KWOK simulates, which runs no process; a container
not started yet) is "not found", a kubelet that does not answer is "unavailable".
"""

from __future__ import annotations

import dataclasses
import json

MAX_UPSTREAM_CHARS = 300
"""How much of an upstream message a sentence quotes."""


@dataclasses.dataclass(frozen=True)
class Unavailable:
    """The HTTP status, stable code and sentence of a log that cannot be read."""

    status: int
    code: str
    message: str


def upstream_message(text: str) -> str:
    """The `message` of a Kubernetes Status body, else the text itself (shortened)."""
    raw = text.strip()
    start = raw.find("{")
    if start >= 0:
        try:
            body = json.loads(raw[start:])
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            raw = body["message"]
    return raw[:MAX_UPSTREAM_CHARS]


def unavailable(
    *,
    pod: str,
    node: str,
    container: str,
    upstream_status: int | None,
    upstream: str,
    simulated: bool,
) -> Unavailable:
    """Say why the log of `container` in `pod` cannot be streamed, in words."""
    if simulated:
        return Unavailable(
            404,
            "NoLogOnSimulatedNode",
            f"pod {pod} runs on {node}, a node KWOK simulates: no process runs there, so "
            f"container {container} keeps no log",
        )
    message = upstream_message(upstream)
    if upstream_status in {400, 404}:
        return Unavailable(
            404,
            "LogNotFound",
            f"container {container} of pod {pod} on node {node or '(none)'} has no log (yet): "
            f"{message}",
        )
    return Unavailable(
        503,
        "LogUnavailable",
        f"the log of pod {pod} on node {node or '(none)'} cannot be read now: {message}",
    )
