"""Bearer tokens from a kubeconfig's `tokenFile`, re-read whenever the file changes.

kubernetes_asyncio reads a kubeconfig's `tokenFile` once, at load time; a token that is
rotated on disk (a bound ServiceAccount token renewed before it expires, as the dev cluster
does for its host processes) would be used after it expired. `refresh_hook` returns a
function for the client Configuration's `refresh_api_key_hook`, which the client calls
before every request: it stats the file and reads it again only when it changed.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import yaml

BEARER_KEY = "BearerToken"


def token_file(kubeconfig: pathlib.Path) -> pathlib.Path | None:
    """The `tokenFile` of the kubeconfig's current user (relative to the kubeconfig), if any."""
    try:
        doc = yaml.safe_load(kubeconfig.read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(doc, dict):
        return None
    current = doc.get("current-context")
    context = next((c.get("context") or {} for c in doc.get("contexts") or []
                    if isinstance(c, dict) and c.get("name") == current), {})  # fmt: skip
    user = next((u.get("user") or {} for u in doc.get("users") or []
                 if isinstance(u, dict) and u.get("name") == context.get("user")), {})  # fmt: skip
    path = user.get("tokenFile") if isinstance(user, dict) else None
    if not isinstance(path, str) or not path:
        return None
    return kubeconfig.parent / path


def refresh_hook(path: pathlib.Path) -> Callable[[Any], None]:
    """A `refresh_api_key_hook` that keeps `api_key["BearerToken"]` equal to the file."""
    seen: list[tuple[int, int]] = []

    def hook(configuration: Any) -> None:
        try:
            stat = path.stat()
        except OSError:
            return  # keep the last token: the file is being replaced
        stamp = (stat.st_mtime_ns, stat.st_size)
        if seen and seen[0] == stamp:
            return
        token = path.read_text().strip()
        if token:
            configuration.api_key[BEARER_KEY] = f"Bearer {token}"
            seen[:] = [stamp]

    return hook


class FileToken:
    """A token kept in a file (a projected ServiceAccount token), re-read when it changes.

    The kubelet rotates a projected token by swapping a symlink, so the file's identity and
    size are checked on every read and the text read again only when they changed; a
    missing or unreadable file reads as '' (the caller refuses to send nothing).
    """

    def __init__(self, path: pathlib.Path) -> None:
        self._path = path
        self._stamp: tuple[int, int, int] | None = None
        self._token = ""

    def __call__(self) -> str:
        """The current token, '' when there is none."""
        try:
            stat = self._path.stat()
            stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if stamp != self._stamp:
                self._token = self._path.read_text(encoding="ascii").strip()
                self._stamp = stamp
        except (OSError, UnicodeDecodeError):
            self._stamp, self._token = None, ""
        return self._token
