"""Tokens renewed on disk: a kubeconfig's tokenFile found, and re-read when it changes."""

from __future__ import annotations

import os
import pathlib
import types

import yaml

from devcluster import tokens
from shared import kubetoken

ADMIN = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "dev", "cluster": {"server": "https://127.0.0.1:6443",
                                             "certificate-authority": "/pki/ca.crt"}}],
    "users": [{"name": "admin", "user": {"client-certificate": "/pki/admin.crt"}}],
    "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "admin"}}],
    "current-context": "dev",
}  # fmt: skip


def test_a_kubeconfig_for_a_token_file_points_at_it(tmp_path: pathlib.Path) -> None:
    """The dev cluster's per-process kubeconfig: the admin's cluster, the process's token."""
    admin = tmp_path / "admin"
    admin.write_text(yaml.safe_dump(ADMIN))
    config = tmp_path / "kubeconfig"
    config.write_text(tokens.kubeconfig_for(admin, tmp_path / "token", "taugrid-controller"))
    doc = yaml.safe_load(config.read_text())
    assert doc["clusters"] == ADMIN["clusters"]
    assert kubetoken.token_file(config) == tmp_path / "token"
    assert kubetoken.token_file(admin) is None
    assert kubetoken.token_file(tmp_path / "missing") is None


def test_the_hook_rereads_the_token_only_when_the_file_changes(tmp_path: pathlib.Path) -> None:
    """Before each request the client asks the hook; a renewed file replaces the token."""
    path = tmp_path / "token"
    path.write_text("first\n")
    cfg = types.SimpleNamespace(api_key={})
    hook = kubetoken.refresh_hook(path)
    hook(cfg)
    assert cfg.api_key == {"BearerToken": "Bearer first"}
    cfg.api_key["BearerToken"] = "Bearer stale-but-unchanged-file"
    hook(cfg)
    assert cfg.api_key["BearerToken"] == "Bearer stale-but-unchanged-file"
    path.write_text("second-and-longer\n")
    os.utime(path, ns=(1, 2_000_000_000_000_000_000))
    hook(cfg)
    assert cfg.api_key["BearerToken"] == "Bearer second-and-longer"
    path.unlink()
    hook(cfg)
    assert cfg.api_key["BearerToken"] == "Bearer second-and-longer"


def test_a_file_token_follows_a_rotation_by_symlink_swap(tmp_path: pathlib.Path) -> None:
    """As the kubelet rotates a projected token (a new file, the symlink swapped): the reader
    returns the new token; a vanished file reads as '' rather than the old token."""
    (tmp_path / "v1").write_text("first\n")
    (tmp_path / "v2").write_text("second\n")
    link = tmp_path / "token"
    link.symlink_to(tmp_path / "v1")
    read = kubetoken.FileToken(link)
    before = read()
    swap = tmp_path / "token.tmp"
    swap.symlink_to(tmp_path / "v2")
    swap.replace(link)
    after = read()
    link.unlink()
    expected = ("first", "second", "")
    assert expected == (before, after, read())
