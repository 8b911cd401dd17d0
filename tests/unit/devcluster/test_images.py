"""The local image build's pure parts: cache keys, layers, the OCI archive."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import tarfile

from devcluster import build, images, imagespec

SPEC = imagespec.load()


def test_a_layer_is_reproducible(tmp_path: pathlib.Path) -> None:
    """The same files give the same layer digest, whatever their mtimes and owners on disk."""
    root = tmp_path / "root"
    (root / "opt").mkdir(parents=True)
    (root / "opt" / "a.py").write_text("print(1)\n")
    first = images.write_layer(tmp_path / "one.tar", root)
    (root / "opt" / "a.py").touch()
    second = images.write_layer(tmp_path / "two.tar", root)
    assert first.digest == second.digest
    assert first.digest == hashlib.sha256((tmp_path / "one.tar").read_bytes()).hexdigest()


def test_the_archive_is_an_oci_layout_naming_the_reference(tmp_path: pathlib.Path) -> None:
    """index.json names the reference for containerd's import; every blob is there under its
    digest, the config's diff IDs are the layers' digests."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "pause").write_text("x")
    layer = images.write_layer(tmp_path / "layer.tar", root)
    config = images.oci_config(SPEC, SPEC.image("controller"), [layer.digest])
    ref = "docker.io/taugrid/controller:dev-0123"
    images.write_archive(tmp_path / "image.tar", ref, config, [layer])
    with tarfile.open(tmp_path / "image.tar") as tar:
        names = set(tar.getnames())
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        (entry,) = index["manifests"]
        manifest_blob = f"blobs/sha256/{entry['digest'].split(':')[1]}"
        manifest = json.loads(tar.extractfile(manifest_blob).read())  # type: ignore[union-attr]
        blob = tar.extractfile(f"blobs/sha256/{layer.digest}").read()  # type: ignore[union-attr]
    assert entry["annotations"]["io.containerd.image.name"] == ref
    assert {"oci-layout", "index.json", manifest_blob} <= names
    assert [f"sha256:{layer.digest}"] == [x["digest"] for x in manifest["layers"]]
    assert hashlib.sha256(blob).hexdigest() == layer.digest
    assert config["rootfs"] == {"type": "layers", "diff_ids": [f"sha256:{layer.digest}"]}


def test_the_cache_keys_follow_their_inputs() -> None:
    """A new Debian package rebuilds everything; a new lock the deps and images; a source edit
    only the image."""
    other = dataclasses.replace(SPEC, debian_packages=(*SPEC.debian_packages, "curl"))
    assert images.base_key(SPEC) != images.base_key(other)
    assert images.deps_key(SPEC, "lock-a") != images.deps_key(SPEC, "lock-b")
    image = SPEC.image("agent")
    assert images.image_key(SPEC, image, "d", "src-a") != images.image_key(SPEC, image, "d", "b")
    assert images.image_key(SPEC, image, "d", "s") == images.image_key(SPEC, image, "d", "s")


def test_the_account_is_the_one_useradd_would_write() -> None:
    """The controller image's user 65532 has a name, no home and no shell, as the Dockerfile's
    `useradd --system` makes it."""
    passwd, group = images.account_lines("taugrid", 65532)
    assert passwd == "taugrid:x:65532:65532::/nonexistent:/usr/sbin/nologin\n"
    assert group == "taugrid:x:65532:\n"


def test_a_dev_reference_carries_the_image_key() -> None:
    """Each build of changed sources gets its own tag, so the chart's pods roll to it."""
    assert images.dev_ref("agent", "abc") == "docker.io/taugrid/agent:dev-abc"


def test_a_static_binary_image_holds_the_binary_alone_as_its_entrypoint(
    tmp_path: pathlib.Path,
) -> None:
    """Kueue's and KubeRay's operators (and the pause image) are one file each: the binary
    at /manager (where their charts run it), run as a non-root user, tagged by the binary's
    digest; a second build reuses it and a changed binary gets a new tag."""
    binary = tmp_path / "ray-operator"
    binary.write_bytes(b"\x7fELF one")
    builder = images.Builder(root=tmp_path / "cache", out=lambda _line: None)
    ref, archive = builder.static_binary("kuberay", binary)
    assert ref.startswith("docker.io/taugrid/kuberay:dev-")
    with tarfile.open(archive) as tar:
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        (entry,) = index["manifests"]
        blob = f"blobs/sha256/{entry['digest'].split(':')[1]}"
        manifest = json.loads(tar.extractfile(blob).read())  # type: ignore[union-attr]
        config_blob = f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"
        config = json.loads(tar.extractfile(config_blob).read())  # type: ignore[union-attr]
        (layer,) = manifest["layers"]
        layer_file = tar.extractfile(f"blobs/sha256/{layer['digest'].split(':')[1]}")
        with tarfile.open(fileobj=layer_file) as inner:
            members = {m.name: m for m in inner.getmembers()}
            content = inner.extractfile("manager").read()  # type: ignore[union-attr]
    assert entry["annotations"]["io.containerd.image.name"] == ref
    assert config["config"]["Entrypoint"] == ["/manager"]
    assert config["config"]["User"] == "65532:65532"
    assert list(members) == ["manager"]
    assert content == b"\x7fELF one"
    assert builder.static_binary("kuberay", binary) == (ref, archive)
    binary.write_bytes(b"\x7fELF two")
    assert builder.static_binary("kuberay", binary)[0] != ref


def test_the_operator_images_name_built_binaries() -> None:
    """The one install's operator images are made of binaries the build makes."""
    made = {b for c in build.Builder(pathlib.Path("/nonexistent")).components for b in c.binaries}
    assert set(images.OPERATOR_BINARIES.values()) <= made
