"""Build TauGrid's images without Docker, from the image spec, for the dev cluster's real node.

Each image is three uncompressed layers, written as an OCI image archive and imported into the
real node's containerd (`ctr -n k8s.io images import`):

1. base: a Debian rootfs made by `mmdebstrap --variant=minbase` from this machine's configured
   apt sources with the spec's Debian packages (python3 and what it needs), docs and locales
   left out. Cached by the package set, the suite and the options.
2. deps: the locked dependency set (`uv export --frozen --no-dev`) in a relocatable virtual
   environment at the spec's venv path, whose interpreter is Debian's /usr/bin/python3.X (the
   same package in the rootfs and on this machine: checked), bytecode compiled with the
   in-image paths. Cached by uv.lock and the spec; shared by every image.
3. the image's own: the project's wheel built from only the packages the image carries (as
   the Dockerfile does), its account, its files. Cached by the hash of those sources.

Everything is cached under `$TAUGRID_CACHE/images/`; an image whose key matches is never
rebuilt. The pause image (the real node's sandbox image) is one more archive: our own
`pause` binary as a one-file layer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from devcluster import build, imagespec

FORMAT = "1"
"""Bumped whenever the way images are built changes, so every cached layer is remade."""

LAYER_MEDIA = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA = "application/vnd.oci.image.manifest.v1+json"
EPOCH = 0
"""mtime of every file in our own layers: layers are reproducible, so bytecode is hash-checked."""

DPKG_EXCLUDES = (
    "/usr/share/doc/*",
    "/usr/share/man/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
    "/usr/share/lintian/*",
)
"""Paths dpkg leaves out of the base rootfs (as Debian's slim images do)."""
DPKG_KEEP = ("/usr/share/doc/*/copyright",)

DEV_TAG_PREFIX = "dev-"
REPOSITORY = "docker.io/taugrid"
"""The chart's image repositories (`taugrid/<name>`), as containerd normalises them."""
PAUSE_REF = "docker.io/taugrid/pause"
OPERATOR_BINARIES = {"kueue": "kueue", "kuberay": "ray-operator"}
"""Image name → the built binary it holds: Kueue's and KubeRay's operators as pods of the real
node, for the one install (`taugrid dev up --bare`, tests/oneinstall)."""
KEEP_BUILDS = 2
"""Builds of one image kept in the cache (the current one and the one before)."""


class ImageError(Exception):
    """An image could not be built or imported; the message says which step and why."""


def images_root() -> pathlib.Path:
    """The image cache (outside any checkout)."""
    return build.cache_root() / "images"


def _sha256_file(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in (FORMAT, *parts):
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def tree_digest(root: pathlib.Path, paths: Iterable[str]) -> str:
    """Hash the files under `paths` (relative to root), skipping caches and build outputs."""
    h = hashlib.sha256()
    skip_dirs = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", "build", "dist"}
    for rel in sorted(paths):
        top = root / rel
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for f in files:
            parts = set(f.relative_to(root).parts)
            if parts & skip_dirs or f.suffix in {".pyc", ".pyo", ".so"}:
                continue
            h.update(f.relative_to(root).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------- keys (pure)
def base_key(spec: imagespec.Spec) -> str:
    """What decides the Debian rootfs."""
    return _key("base", spec.debian, *spec.debian_packages, *DPKG_EXCLUDES, *DPKG_KEEP)


def deps_key(spec: imagespec.Spec, lock_digest: str) -> str:
    """What decides the dependency layer."""
    return _key("deps", base_key(spec), spec.python, spec.venv, lock_digest)


def image_key(spec: imagespec.Spec, image: imagespec.Image, deps: str, source: str) -> str:
    """What decides one image (its own layer and its config)."""
    fields = json.dumps(dataclasses.asdict(image), sort_keys=True)
    return _key("image", deps, fields, json.dumps(dict(spec.env), sort_keys=True), source)


def dev_ref(name: str, key: str) -> str:
    """The reference an image is imported under (the chart's repository, a dev tag)."""
    return f"{REPOSITORY}/{name}:{DEV_TAG_PREFIX}{key}"


def oci_config(
    spec: imagespec.Spec, image: imagespec.Image, diff_ids: Sequence[str]
) -> dict[str, object]:
    """The OCI image config: what the Dockerfile's ENV, USER, EXPOSE, ENTRYPOINT, LABEL set."""
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env = {"PATH": path}
    for k, v in spec.env.items():
        env[k] = v.replace("$PATH", env.get("PATH", ""))
    config: dict[str, object] = {
        "Env": [f"{k}={v}" for k, v in env.items()],
        "Entrypoint": list(image.entrypoint),
        "User": f"{image.user}:{image.user}",
        "WorkingDir": "/",
        "Labels": imagespec.labels(spec, image),
    }
    if image.port:
        config["ExposedPorts"] = {f"{image.port}/tcp": {}}
    return {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d in diff_ids]},
    }


def account_lines(name: str, uid: int) -> tuple[str, str]:
    """The /etc/passwd and /etc/group lines `useradd --system` writes for the image's account."""
    return (
        f"{name}:x:{uid}:{uid}::/nonexistent:/usr/sbin/nologin\n",
        f"{name}:x:{uid}:\n",
    )


# ---------------------------------------------------------------------- layers (I/O)
@dataclasses.dataclass(frozen=True)
class Layer:
    """An uncompressed layer tar in the cache; its digest is also its diff ID."""

    path: pathlib.Path
    digest: str
    size: int

    @classmethod
    def of(cls, path: pathlib.Path) -> Layer:
        """Describe a finished layer file (digest recorded beside it)."""
        meta = path.with_suffix(".sha256")
        if meta.exists():
            digest = meta.read_text().strip()
        else:
            digest = _sha256_file(path)
            meta.write_text(digest + "\n")
        return cls(path, digest, path.stat().st_size)


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = EPOCH
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def write_layer(out: pathlib.Path, root: pathlib.Path, prefix: str = "") -> Layer:
    """Tar a directory (its contents at the image's root), reproducibly: sorted, owned by
    root, fixed mtimes."""
    tmp = out.with_suffix(".partial")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root).as_posix()
            tar.add(path, arcname=prefix + rel, recursive=False, filter=_normalise)
    tmp.replace(out)
    out.with_suffix(".sha256").unlink(missing_ok=True)
    return Layer.of(out)


class Builder:
    """Builds the spec's images into the cache and returns their references."""

    def __init__(
        self,
        spec: imagespec.Spec | None = None,
        root: pathlib.Path | None = None,
        out: Callable[[str], None] | None = None,
    ) -> None:
        self.spec = spec or imagespec.load()
        self.root = root or images_root()
        self.repo = imagespec.REPO
        self._out = out or (lambda line: print(line, flush=True))
        self._started = time.monotonic()

    def say(self, msg: str) -> None:
        """Print one progress line with the time since the build started."""
        elapsed = time.monotonic() - self._started
        self._out(f"[taugrid images {int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}] {msg}")

    def _run(self, what: str, argv: Sequence[str], **kw: object) -> str:
        started = time.monotonic()
        proc = subprocess.run(  # type: ignore[call-overload]
            list(argv), capture_output=True, text=True, check=False, **kw
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-20:])
            msg = f"{what} failed (exit {proc.returncode}):\n{tail}"
            raise ImageError(msg)
        self.say(f"{what}: done in {time.monotonic() - started:.0f}s")
        return str(proc.stdout)

    # ------------------------------------------------------------------ base
    def base(self) -> tuple[Layer, pathlib.Path]:
        """The Debian rootfs layer, and the extracted rootfs (the deps layer reads it)."""
        key = base_key(self.spec)
        d = self.root / "base" / key
        layer = d / "layer.tar"
        rootfs = d / "rootfs"
        if layer.exists() and rootfs.is_dir():
            self.say(f"base {key}: cached")
            return Layer.of(layer), rootfs
        for tool in ("mmdebstrap",):
            if shutil.which(tool) is None:
                msg = f"{tool} not found: apt-get install {tool} (scripts/test installs it)"
                raise ImageError(msg)
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        sources = _apt_sources()
        opts = [f"--dpkgopt=path-exclude={p}" for p in DPKG_EXCLUDES]
        opts += [f"--dpkgopt=path-include={p}" for p in DPKG_KEEP]
        self.say(
            f"base {key}: mmdebstrap {self.spec.debian} + {', '.join(self.spec.debian_packages)}"
        )
        tmp_root = d / "rootfs.partial"
        self._run(
            "mmdebstrap",
            [
                "mmdebstrap",
                "--variant=minbase",
                "--mode=root",
                "--format=directory",
                f"--include={','.join(self.spec.debian_packages)}",
                *opts,
                self.spec.debian,
                str(tmp_root),
                str(sources),
            ],
        )
        (d / "packages.txt").write_text(
            self._run(
                "dpkg-query",
                [
                    "dpkg-query",
                    f"--admindir={tmp_root}/var/lib/dpkg",
                    "-W",
                    "-f=${Package} ${Version}\n",
                ],
            )
        )
        tmp_root.rename(rootfs)
        with tarfile.open(layer.with_suffix(".partial"), "w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(rootfs.iterdir()):
                tar.add(path, arcname=path.name)
        layer.with_suffix(".partial").replace(layer)
        return Layer.of(layer), rootfs

    # ------------------------------------------------------------------ deps
    def _interpreter(self, rootfs: pathlib.Path) -> pathlib.Path:
        """Debian's python3.X on this machine, checked to be the very package in the rootfs."""
        py = f"python{self.spec.python}"
        host = pathlib.Path("/usr/bin") / py
        if not (rootfs / "usr" / "bin" / py).exists():
            msg = f"the base rootfs has no /usr/bin/{py}: the spec's python and Debian disagree"
            raise ImageError(msg)
        if not host.exists():
            msg = f"/usr/bin/{py} not found on this machine: apt-get install {py}"
            raise ImageError(msg)
        wanted = _dpkg_version(rootfs / "var" / "lib" / "dpkg", f"{py}-minimal")
        have = _dpkg_version(pathlib.Path("/var/lib/dpkg"), f"{py}-minimal")
        # The same upstream release: the venv's symlink, its pyvenv.cfg and the bytecode magic
        # are what the interpreter in the image must agree with; Debian revisions may differ.
        if wanted.split("-")[0] != have.split("-")[0]:
            msg = (
                f"Debian's {py}-minimal is {have or 'absent'} here but {wanted} in the rootfs: "
                f"apt-get install {py} (the venv is built with it)"
            )
            raise ImageError(msg)
        return host

    def deps(self, rootfs: pathlib.Path) -> tuple[Layer, str, pathlib.Path]:
        """The dependency layer, its key, and its venv (the image layers start from a copy)."""
        lock = self.repo / "uv.lock"
        key = deps_key(self.spec, _sha256_file(lock)[:16])
        d = self.root / "deps" / key
        layer = d / "layer.tar"
        venv = d / "root" / self.spec.venv.lstrip("/")
        if layer.exists() and venv.is_dir():
            self.say(f"deps {key}: cached")
            return Layer.of(layer), key, venv
        python = self._interpreter(rootfs)
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        req = d / "requirements.txt"
        req.write_text(
            self._run(
                "uv export",
                [
                    "uv",
                    "export",
                    "--frozen",
                    "--no-dev",
                    "--no-emit-project",
                    "--no-header",
                    "--quiet",
                ],
                cwd=self.repo,
            )
        )
        self._run(
            "uv venv",
            ["uv", "venv", "--quiet", "--relocatable", "--python", str(python), str(venv)],
        )
        self._run(
            "uv pip install (locked dependencies)",
            [
                "uv",
                "pip",
                "install",
                "--quiet",
                "--python",
                str(venv / "bin" / "python"),
                "--no-deps",
                "--link-mode=copy",
                "-r",
                str(req),
            ],
        )
        _drop_activation_scripts(venv)
        self._compile(python, d / "root", venv)
        write_layer(layer, d / "root")
        return Layer.of(layer), key, venv

    def _compile(self, python: pathlib.Path, root: pathlib.Path, target: pathlib.Path) -> None:
        """Compile bytecode as the image will see it: in-image paths, hash-checked (the layers'
        mtimes are fixed)."""
        self._run(
            "compileall",
            [
                str(python),
                "-m",
                "compileall",
                "-q",
                "-j",
                "0",
                "--invalidation-mode",
                "unchecked-hash",
                "-s",
                str(root),
                "-p",
                "/",
                str(target),
            ],
        )

    # ------------------------------------------------------------------ images
    def image(
        self, name: str, base: Layer, rootfs: pathlib.Path, deps: tuple[Layer, str, pathlib.Path]
    ) -> tuple[str, pathlib.Path]:
        """Build one image's archive; return its reference and the archive path."""
        image = self.spec.image(name)
        deps_layer, dkey, venv = deps
        sources = [*image.packages, *image.files]
        if image.packages:
            sources += ["pyproject.toml", "uv.lock", "README.md"]
        client = self._podresources() if image.podresources_client else None
        source = tree_digest(self.repo, sources) + (client.name if client else "")
        key = image_key(self.spec, image, dkey if image.packages else "", source)
        d = self.root / "image" / f"{name}-{key}"
        archive = d / "image.oci.tar"
        ref = dev_ref(name, key)
        if archive.exists():
            self.say(f"{name} {key}: cached")
            return ref, archive
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        own = d / "root"
        own.mkdir()
        if image.packages:
            self._project_layer(image, own, venv)
        for src, dest in image.files.items():
            target = own / dest.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(self.repo / src, target)
        if image.account:
            self._account(image, own, rootfs)
        if client is not None:
            shutil.copytree(client, own / image.podresources_client.lstrip("/"))
        layer = write_layer(d / "layer.tar", own)
        layers = [base, deps_layer, layer] if image.packages else [base, layer]
        config = oci_config(self.spec, image, [x.digest for x in layers])
        write_archive(archive, ref, config, layers)
        shutil.rmtree(own)
        self.say(f"{name} {key}: {archive} ({sum(x.size for x in layers) >> 20} MiB)")
        self._prune(name, keep=d)
        return ref, archive

    def _prune(self, name: str, keep: pathlib.Path, count: int = KEEP_BUILDS) -> None:
        """Keep the newest builds of an image (each is an archive of a few hundred MiB)."""
        builds = sorted(
            (p for p in (self.root / "image").glob(f"{name}-*") if p != keep),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        for old in builds[count - 1 :]:
            shutil.rmtree(old, ignore_errors=True)

    def _project_layer(self, image: imagespec.Image, own: pathlib.Path, venv: pathlib.Path) -> None:
        """Install the project's wheel (only the image's packages) over a copy of the deps venv
        and keep what it added."""
        project = imagespec.Project.read(self.repo)
        with tempfile.TemporaryDirectory(prefix="taugrid-image-") as tmp:
            ctx = pathlib.Path(tmp) / "ctx"
            ctx.mkdir()
            for f in ("pyproject.toml", "uv.lock", "README.md"):
                shutil.copy(self.repo / f, ctx / f)
            for p in image.packages:
                skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
                shutil.copytree(self.repo / p, ctx / p, ignore=skip)
            dist = pathlib.Path(tmp) / "dist"
            self._run(
                "uv build (wheel)",
                ["uv", "build", "--wheel", "--quiet", "--out-dir", str(dist), str(ctx)],
            )
            wheel = next(dist.glob("*.whl"))
            scratch_root = pathlib.Path(tmp) / "root"
            scratch = scratch_root / self.spec.venv.lstrip("/")
            shutil.copytree(venv, scratch, symlinks=True)
            before = {p.relative_to(scratch) for p in scratch.rglob("*")}
            self._run(
                "uv pip install (project wheel)",
                [
                    "uv",
                    "pip",
                    "install",
                    "--quiet",
                    "--python",
                    str(scratch / "bin" / "python"),
                    "--no-deps",
                    "--link-mode=copy",
                    str(wheel),
                ],
            )
            for script in project.dropped_scripts(image):
                (scratch / "bin" / script).unlink(missing_ok=True)
            python = pathlib.Path("/usr/bin") / f"python{self.spec.python}"
            site = next(scratch.glob("lib/python*/site-packages"))
            new_pkgs = [site / p for p in image.packages if (site / p).is_dir()]
            for pkg in new_pkgs:
                self._compile(python, scratch_root, pkg)
            for path in sorted(scratch.rglob("*")):
                rel = path.relative_to(scratch)
                if rel in before or path.is_dir():
                    continue
                target = own / self.spec.venv.lstrip("/") / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target, follow_symlinks=False)

    def _podresources(self) -> pathlib.Path:
        """The generated PodResources client (cached by its proto's digest)."""
        from devcluster import podresources  # noqa: PLC0415  (needs grpc_tools: dev only)

        try:
            return podresources.build()
        except (podresources.BuildError, OSError) as err:
            msg = f"the agent's PodResources client did not build: {err}"
            raise ImageError(msg) from err

    def _account(self, image: imagespec.Image, own: pathlib.Path, rootfs: pathlib.Path) -> None:
        passwd, group = account_lines(image.account, image.user)
        etc = own / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "passwd").write_text((rootfs / "etc" / "passwd").read_text() + passwd)
        (etc / "group").write_text((rootfs / "etc" / "group").read_text() + group)

    def pause(self, pause_binary: pathlib.Path) -> tuple[str, pathlib.Path]:
        """The sandbox image: our `pause` binary alone, as /pause."""
        return self.static_binary("pause", pause_binary, file="pause", user=65535)

    def static_binary(
        self, name: str, binary: pathlib.Path, *, file: str = "manager", user: int = 65532
    ) -> tuple[str, pathlib.Path]:
        """An image of one static binary from the build cache, as `/<file>`, its entrypoint,
        run as `user` (the pause image; Kueue's and KubeRay's operators for the one install,
        `OPERATOR_BINARIES`, at /manager where their upstream images and charts have them).
        Return (ref, archive), cached by the binary's digest and its path."""
        digest = _sha256_file(binary)[:16]
        key = _key(name, digest) if file == name else _key(name, digest, file)
        d = self.root / name / key
        archive = d / "image.oci.tar"
        ref = f"{REPOSITORY}/{name}:{DEV_TAG_PREFIX}{key}"
        if archive.exists():
            self.say(f"{name} {key}: cached")
            return ref, archive
        d.mkdir(parents=True, exist_ok=True)
        own = d / "root"
        own.mkdir(exist_ok=True)
        shutil.copy(binary, own / file)
        layer = write_layer(d / "layer.tar", own)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": [f"/{file}"], "User": f"{user}:{user}", "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer.digest}"]},
        }
        write_archive(archive, ref, config, [layer])
        shutil.rmtree(own)
        return ref, archive

    def build(self, names: Sequence[str] | None = None) -> dict[str, tuple[str, pathlib.Path]]:
        """Build the named images (default: all of the spec); return name → (ref, archive)."""
        base, rootfs = self.base()
        wanted = list(names or self.spec.images)
        deps = self.deps(rootfs) if any(self.spec.image(n).packages for n in wanted) else None
        out = {}
        for name in wanted:
            img = self.spec.image(name)
            if img.packages and deps is None:  # pragma: no cover - guarded above
                raise ImageError(name)
            out[name] = self.image(name, base, rootfs, deps or (base, "", rootfs))
        return out


def _dpkg_version(admindir: pathlib.Path, package: str) -> str:
    proc = subprocess.run(
        ["dpkg-query", f"--admindir={admindir}", "-W", "-f=${Version}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _apt_sources() -> pathlib.Path:
    """This machine's configured apt sources (deb822 or one-line), for mmdebstrap."""
    for candidate in (
        pathlib.Path("/etc/apt/sources.list.d/debian.sources"),
        pathlib.Path("/etc/apt/sources.list"),
    ):
        if candidate.exists() and candidate.read_text().strip():
            return candidate
    found = sorted(pathlib.Path("/etc/apt/sources.list.d").glob("*.sources"))
    if found:
        return found[0]
    msg = "no apt sources configured on this machine (/etc/apt/sources.list.d/*.sources)"
    raise ImageError(msg)


def _drop_activation_scripts(venv: pathlib.Path) -> None:
    """An image never activates its venv (PATH names it): leave out the shell activators."""
    for path in (venv / "bin").glob("activate*"):
        path.unlink()
    for name in ("deactivate.bat", "pydoc.bat"):
        (venv / "bin" / name).unlink(missing_ok=True)


def _json_blob(obj: object) -> tuple[bytes, str]:
    data = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return data, hashlib.sha256(data).hexdigest()


def write_archive(
    out: pathlib.Path, ref: str, config: Mapping[str, object], layers: Sequence[Layer]
) -> None:
    """Write an OCI image-layout archive (oci-layout, index.json, blobs) naming `ref`."""
    config_bytes, config_digest = _json_blob(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA,
        "config": {
            "mediaType": CONFIG_MEDIA,
            "digest": f"sha256:{config_digest}",
            "size": len(config_bytes),
        },
        "layers": [
            {"mediaType": LAYER_MEDIA, "digest": f"sha256:{x.digest}", "size": x.size}
            for x in layers
        ],
    }
    manifest_bytes, manifest_digest = _json_blob(manifest)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": MANIFEST_MEDIA,
                "digest": f"sha256:{manifest_digest}",
                "size": len(manifest_bytes),
                "annotations": {
                    "io.containerd.image.name": ref,
                    "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1],
                },
            }
        ],
    }
    tmp = out.with_suffix(".partial")

    def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = _normalise(tarfile.TarInfo(name))
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(tmp, "w") as tar:
        add_bytes(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add_bytes(tar, "index.json", json.dumps(index).encode())
        add_bytes(tar, f"blobs/sha256/{config_digest}", config_bytes)
        add_bytes(tar, f"blobs/sha256/{manifest_digest}", manifest_bytes)
        for layer in layers:
            tar.add(layer.path, arcname=f"blobs/sha256/{layer.digest}", filter=_normalise)
    tmp.replace(out)


def import_archives(
    ctr: pathlib.Path, address: pathlib.Path, archives: Sequence[pathlib.Path]
) -> None:
    """Import image archives into containerd's `k8s.io` namespace (the CRI's), unpacked."""
    for archive in archives:
        proc = subprocess.run(
            [str(ctr), "--address", str(address), "-n", "k8s.io", "images", "import", str(archive)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            msg = f"ctr images import {archive.name} failed: {proc.stderr.strip()}"
            raise ImageError(msg)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `taugrid dev images`: build (or reuse) every image of the spec."""
    try:
        built = Builder().build(list(argv or []) or None)
    except (ImageError, imagespec.SpecError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name, (ref, archive) in built.items():
        print(f"{name:<12} {ref}  {archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
