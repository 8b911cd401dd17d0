"""Build the local control plane from Go modules into a cache outside the repository.

Every component is built in its own module (DESIGN.md section 8): Kubernetes, etcd, Kueue,
KubeRay, KWOK and Helm each pin different Kubernetes library versions, and one shared module
would let Go's minimal version selection break all of them.

The cache lives at `$TAUGRID_CACHE` (default `~/.cache/taugrid`) under
`cluster/<stamp>/`, where the stamp hashes the versions, the committed wrapper modules and
the build flags. A component whose marker file holds its stamp is never rebuilt, so CI
reuses what an earlier run built and a version bump rebuilds only what changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

REPO = pathlib.Path(__file__).resolve().parent.parent
GO_DIR = pathlib.Path(__file__).resolve().parent / "go"

K8S_VERSION = "v1.37.2"
ETCD_VERSION = "v3.6.16"
KUEUE_VERSION = "v0.19.2"
"""The newest Kueue the Go module proxy serves: proxy.golang.org answers 403 for every
v0.19.3+, v0.20.x and v0.21.0-rc.x (docs/platform.md, "Kueue versions")."""
KUEUE_VERSIONS = ("v0.17.0", "v0.17.1", "v0.18.4", "v0.19.2")
"""The Kueue versions a dev cluster may be built against (`TAUGRID_KUEUE_VERSION`): the
supported floor (v0.17, the first to serve `kueue.x-k8s.io/v1beta2`), the newest of each
minor line the proxy serves, and the default. Each builds with the same metrics patch."""
KUBERAY_VERSION = "v1.5.0"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.22.0"
CONTAINERD_VERSION = "v2.3.7"
"""containerd 2.x: Kubernetes >= 1.36 refuses containerd 1.x; 2.3 still runs on cgroup v1
(deprecated since 2.2, supported until 2029), which the machines of this project boot."""
KUBELET_API_PROTO = "pkg/apis/deviceplugin/v1beta1/api.proto"
"""The device-plugin API inside the k8s.io/kubelet module, copied into the assets so the fake
device plugin's stubs are generated from the published file (never committed)."""

BUILD_FORMAT = "3"
"""Bumped whenever the way we build or lay out the cache changes."""

PROGRESS_EVERY_S = 30.0
"""How often a long build step reports that it is still working, so CI never sits silent."""

KUEUE_CERT_PATCH = (
    'metricsCertPath := "/etc/kueue/metrics/certs"',
    'metricsCertPath := os.Getenv("KUEUE_METRICS_CERT_DIR")',
)
"""Kueue hard-codes its metrics certificate directory; we point it at our own PKI instead."""


class BuildError(Exception):
    """A component could not be built; the message says which and why."""


def kueue_version() -> str:
    """The Kueue to build and run: `$TAUGRID_KUEUE_VERSION` when set (one of
    `KUEUE_VERSIONS`, so the floor can be tried without editing code), else `KUEUE_VERSION`.
    Each version has its own cache stamp, so switching back rebuilds nothing."""
    raw = os.environ.get("TAUGRID_KUEUE_VERSION", "").strip() or KUEUE_VERSION
    if raw not in KUEUE_VERSIONS:
        msg = f"TAUGRID_KUEUE_VERSION must be one of {', '.join(KUEUE_VERSIONS)}, not {raw!r}"
        raise BuildError(msg)
    return raw


class PrerequisiteError(BuildError):
    """A tool the build needs is missing; the message says what to install."""


def cache_root() -> pathlib.Path:
    """Return the TauGrid cache directory (outside any checkout)."""
    env = os.environ.get("TAUGRID_CACHE")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "taugrid"


PREREQUISITES: dict[str, str] = {
    "go": "Go 1.26 or newer (https://go.dev/doc/install; Debian: apt-get install golang-1.26)",
    "gcc": "gcc (Debian: apt-get install gcc)",
    "openssl": "the openssl command (Debian: apt-get install openssl)",
}


def check_prerequisites(tools: Sequence[str] = ("go", "gcc", "openssl")) -> None:
    """Fail at once, naming what to install, when a needed tool is missing."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        lines = [f"  - {t}: install {PREREQUISITES[t]}" for t in missing]
        msg = "missing prerequisites:\n" + "\n".join(lines)
        raise PrerequisiteError(msg)
    if "go" in tools:
        out = subprocess.run(
            ["go", "env", "GOVERSION"], capture_output=True, text=True, check=False
        )
        version = out.stdout.strip().removeprefix("go")
        parts = version.split(".")
        if len(parts) < 2 or not parts[1].isdigit() or (int(parts[0]), int(parts[1])) < (1, 26):
            msg = f"Go {version or '?'} is too old: install Go 1.26 or newer"
            raise PrerequisiteError(msg)


@dataclasses.dataclass(frozen=True)
class Component:
    """One thing to build: a name, what it produces and the inputs its stamp covers."""

    name: str
    binaries: tuple[str, ...]
    inputs: tuple[str, ...]
    build: Callable[[Builder], None]
    assets: tuple[str, ...] = ()
    """Asset folders (under `assets/`) the component makes: what `reuse` copies besides
    its binaries. Empty for the older components, which are never reused (only rebuilt)."""


def _file_digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _wrapper_inputs(name: str) -> tuple[str, ...]:
    d = GO_DIR / name
    return tuple(
        f"{p.name}:{_file_digest(p)}"
        for p in sorted(d.iterdir())
        if p.suffix in {".mod", ".sum", ".go"}
    )


def _k8s_ldflags() -> str:
    minor = K8S_VERSION.split(".")[1]
    return " ".join(
        [
            "-s -w",
            f"-X k8s.io/component-base/version.gitVersion={K8S_VERSION}",
            "-X k8s.io/component-base/version.gitMajor=1",
            f"-X k8s.io/component-base/version.gitMinor={minor}",
            "-X k8s.io/component-base/version.gitTreeState=clean",
            f"-X k8s.io/client-go/pkg/version.gitVersion={K8S_VERSION}",
        ]
    )


class Builder:
    """Runs the Go builds for one stamp directory, reporting progress as it goes."""

    def __init__(self, root: pathlib.Path | None = None, out: Callable[[str], None] | None = None):
        self.root = root or cache_root()
        self._out = out or (lambda line: print(line, flush=True))
        self.components = _components()
        self.stamp = stamp_of(self.components)
        self.dir = self.root / "cluster" / self.stamp
        self.bin = self.dir / "bin"
        self.assets = self.dir / "assets"
        self._started = time.monotonic()

    # ------------------------------------------------------------------ reporting
    def say(self, msg: str) -> None:
        """Print one progress line with the time since the build started."""
        elapsed = time.monotonic() - self._started
        self._out(f"[taugrid build {int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}] {msg}")

    def go_env(self) -> dict[str, str]:
        """Return the environment for every go command: static, reproducible, local toolchain."""
        env = dict(os.environ)
        env.update({"CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false -modcacherw"})
        env.setdefault("GOTOOLCHAIN", "local")
        return env

    def run(
        self,
        what: str,
        argv: Sequence[str],
        cwd: pathlib.Path | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> str:
        """Run a command, printing a heartbeat line while it works; return its stdout."""
        self.say(f"{what}: {' '.join(argv[:3])} …")
        started = time.monotonic()
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**self.go_env(), **(extra_env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        done = threading.Event()

        def beat() -> None:
            while not done.wait(PROGRESS_EVERY_S):
                self.say(f"{what}: still building ({time.monotonic() - started:.0f}s)")

        ticker = threading.Thread(target=beat, daemon=True)
        ticker.start()
        try:
            stdout, stderr = proc.communicate()
        finally:
            done.set()
        if proc.returncode != 0:
            tail = "\n".join(stderr.strip().splitlines()[-30:])
            msg = f"{what} failed (exit {proc.returncode}):\n{tail}"
            raise BuildError(msg)
        self.say(f"{what}: done in {time.monotonic() - started:.0f}s")
        return stdout

    def module_dir(self, module: str) -> pathlib.Path:
        """Download a module (if needed) and return its read-only directory in the module cache."""
        out = self.run(f"download {module}", ["go", "mod", "download", "-json", module])
        info = json.loads(out)
        if "Error" in info:
            msg = f"cannot download {module}: {info['Error']}"
            raise BuildError(msg)
        return pathlib.Path(info["Dir"])

    def go_install(self, what: str, pkg: str) -> None:
        """`go install pkg@version` into our bin directory (modules without replace lines)."""
        argv = ["go", "install", "-trimpath", "-ldflags", "-s -w", pkg]
        self.run(what, argv, extra_env={"GOBIN": str(self.bin)})

    # ------------------------------------------------------------------ markers
    def _marker(self, c: Component) -> pathlib.Path:
        return self.bin / f".built-{c.name}"

    def is_built(self, c: Component) -> bool:
        """True when the component's marker holds its stamp and its binaries exist."""
        m = self._marker(c)
        return (
            m.exists()
            and m.read_text().strip() == component_stamp(c)
            and all((self.bin / b).exists() for b in c.binaries)
        )

    def reuse(self, c: Component) -> bool:
        """Copy a component from another stamp directory that built exactly it (same
        component stamp), so adding one component does not rebuild the others."""
        want = component_stamp(c)
        for other in sorted((self.root / "cluster").glob("*/bin")):
            if other == self.bin or other.parent.is_symlink():
                continue
            marker = other / f".built-{c.name}"
            try:
                if marker.read_text().strip() != want:
                    continue
            except OSError:
                continue
            if not all((other / b).exists() for b in c.binaries):
                continue
            missing_assets = [
                a for a in _assets_of(c) if not (other.parent / "assets" / a).is_dir()
            ]
            if missing_assets:
                continue
            for binary in c.binaries:
                _copy_file(other / binary, self.bin / binary)
            for asset in _assets_of(c):
                dest = self.assets / asset
                if dest.exists():
                    shutil.rmtree(dest)
                shutil.copytree(other.parent / "assets" / asset, dest)
            return True
        return False

    def build_all(self, *, force: bool = False, only: Sequence[str] = ()) -> pathlib.Path:
        """Build every component that is not built yet; return the stamp directory."""
        check_prerequisites()
        self.bin.mkdir(parents=True, exist_ok=True)
        self.assets.mkdir(parents=True, exist_ok=True)
        self.say(f"cache: {self.dir}")
        for c in self.components:
            if only and c.name not in only:
                continue
            if not force and self.is_built(c):
                self.say(f"{c.name}: cached ({', '.join(c.binaries) or 'assets'})")
                continue
            if not force and self.reuse(c):
                self.say(f"{c.name}: reused from an earlier build with the same stamp")
            else:
                self.say(f"{c.name}: building")
                c.build(self)
            self._marker(c).write_text(component_stamp(c) + "\n")
        (self.dir / "VERSIONS").write_text(json.dumps(versions(), indent=2) + "\n")
        current = self.root / "cluster" / "current"
        tmp = current.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(self.dir.name)
        tmp.replace(current)
        from devcluster import chart  # noqa: PLC0415  (chart imports this module)

        placed = chart.assemble_dependencies(self.assets)
        self.say(f"chart dependencies in {placed}")
        self.say(f"all components built; binaries in {self.bin}")
        return self.dir


def versions() -> dict[str, str]:
    """Return the component versions this build pins."""
    return {
        "kubernetes": K8S_VERSION,
        "etcd": ETCD_VERSION,
        "kueue": kueue_version(),
        "kuberay": KUBERAY_VERSION,
        "kwok": KWOK_VERSION,
        "helm": HELM_VERSION,
        "containerd": CONTAINERD_VERSION,
        "format": BUILD_FORMAT,
    }


def component_stamp(c: Component) -> str:
    """Hash what determines one component's output."""
    h = hashlib.sha256()
    for part in (BUILD_FORMAT, c.name, *c.binaries, *c.inputs):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def stamp_of(components: Sequence[Component]) -> str:
    """Hash every component's stamp into the cache directory name."""
    h = hashlib.sha256()
    for c in components:
        h.update(component_stamp(c).encode())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------- components
K8S_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet")
"""The kubelet is only run for the dev cluster's one real node (DESIGN.md section 8)."""


def _build_k8s(b: Builder) -> None:
    cmds = K8S_COMMANDS
    b.run(
        "kubernetes " + K8S_VERSION,
        [
            "go", "build", "-trimpath", "-ldflags", _k8s_ldflags(), "-o", str(b.bin) + "/",
            *(f"k8s.io/kubernetes/cmd/{c}" for c in cmds),
        ],
        cwd=GO_DIR / "k8s",
    )  # fmt: skip


def _build_etcd(b: Builder) -> None:
    b.run(
        "etcd " + ETCD_VERSION,
        ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(b.bin / "etcd"), "."],
        cwd=GO_DIR / "etcd",
    )


def _build_kwok(b: Builder) -> None:
    b.go_install("kwok " + KWOK_VERSION, f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}")
    src = b.module_dir(f"sigs.k8s.io/kwok@{KWOK_VERSION}")
    dest = b.assets / "kwok"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src / "kustomize" / "stage", dest / "stage")
    shutil.copytree(src / "kustomize" / "crd" / "bases", dest / "crd")
    _make_writable(dest)


def _kueue_ldflags(version: str) -> str:
    """Stamp the version into the binary, as Kueue's Makefile does, so its log names it."""
    return f"-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion={version}"


def _build_kueue(b: Builder) -> None:
    version = kueue_version()
    src = b.module_dir(f"sigs.k8s.io/kueue@{version}")
    work = b.dir / "src" / "kueue"
    if work.exists():
        _make_writable(work)
        shutil.rmtree(work)
    work.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, work)
    _make_writable(work)
    main = work / "cmd" / "kueue" / "main.go"
    text = main.read_text()
    old, new = KUEUE_CERT_PATCH
    if old not in text:
        msg = f"Kueue {version}: metrics certificate path not found in {main}; update the patch"
        raise BuildError(msg)
    main.write_text(text.replace(old, new))
    b.run(
        "kueue " + version,
        [
            "go",
            "build",
            "-trimpath",
            "-ldflags",
            _kueue_ldflags(version),
            "-o",
            str(b.bin / "kueue"),
            "./cmd/kueue",
        ],
        cwd=work,
    )
    dest = b.assets / "kueue"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src / "config" / "components" / "crd" / "bases", dest / "crd")
    (dest / "webhook").mkdir(parents=True)
    shutil.copy(src / "config" / "components" / "webhook" / "manifests.yaml", dest / "webhook")
    _make_writable(dest)
    shutil.rmtree(work)


def _build_kuberay(b: Builder) -> None:
    b.go_install(
        "kuberay " + KUBERAY_VERSION,
        f"github.com/ray-project/kuberay/ray-operator@{KUBERAY_VERSION}",
    )
    src = b.module_dir(f"github.com/ray-project/kuberay/ray-operator@{KUBERAY_VERSION}")
    dest = b.assets / "kuberay"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src / "config" / "crd" / "bases", dest / "crd")
    _make_writable(dest)


def _build_charts(b: Builder) -> None:
    """The chart's dependencies as their modules release them (docs/platform.md, "One
    install"): Kueue's Helm chart, which ships in its Go module, and the KubeRay operator's
    released manifests (CRDs, RBAC), from which `chart.assemble_dependencies` makes the
    `kuberay-operator` chart: no KubeRay chart is served through the Go proxy."""
    dest = b.assets / "charts"
    if dest.exists():
        _make_writable(dest)
        shutil.rmtree(dest)
    kueue = b.module_dir(f"sigs.k8s.io/kueue@{KUEUE_VERSION}") / "charts" / "kueue"
    shutil.copytree(kueue, dest / "kueue", ignore=shutil.ignore_patterns(*CHART_SKIPPED))
    ray = b.module_dir(f"github.com/ray-project/kuberay/ray-operator@{KUBERAY_VERSION}")
    shutil.copytree(ray / "config" / "crd" / "bases", dest / "kuberay" / "crds")
    (dest / "kuberay" / "rbac").mkdir(parents=True)
    for name in KUBERAY_RBAC:
        shutil.copy(ray / "config" / "rbac" / name, dest / "kuberay" / "rbac" / name)
    _make_writable(dest)


CHART_SKIPPED = ("tests", "README.md.gotmpl")
"""Parts of Kueue's chart directory that are its own tooling, not the chart."""
KUBERAY_RBAC = ("role.yaml", "leader_election_role.yaml")
"""The ray-operator module's RBAC manifests whose rules the kuberay-operator chart renders."""


def _build_helm(b: Builder) -> None:
    b.go_install("helm " + HELM_VERSION, f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}")


CONTAINERD_COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr")


def _containerd_ldflags() -> str:
    return f"-s -w -X github.com/containerd/containerd/v2/version.Version={CONTAINERD_VERSION}"


def _build_containerd(b: Builder) -> None:
    b.run(
        "containerd " + CONTAINERD_VERSION,
        [
            "go", "build", "-trimpath", "-ldflags", _containerd_ldflags(), "-o", str(b.bin) + "/",
            *(f"github.com/containerd/containerd/v2/cmd/{c}" for c in CONTAINERD_COMMANDS),
        ],
        cwd=GO_DIR / "containerd",
    )  # fmt: skip


def _build_pause(b: Builder) -> None:
    b.run(
        "pause",
        ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(b.bin / "pause"), "."],
        cwd=GO_DIR / "pause",
    )


def _build_kubelet_api(b: Builder) -> None:
    src = b.module_dir(f"k8s.io/kubelet@{_staging_version()}")
    dest = b.assets / "deviceplugin"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / KUBELET_API_PROTO, dest / "api.proto")
    _make_writable(dest)


def _staging_version() -> str:
    return "v0." + K8S_VERSION.removeprefix("v1.")


ASSETS_OF: dict[str, tuple[str, ...]] = {
    "kwok": ("kwok",),
    "kueue": ("kueue",),
    "kuberay": ("kuberay",),
}
"""Asset folders of the components that declare none themselves."""


def _assets_of(c: Component) -> tuple[str, ...]:
    return c.assets or ASSETS_OF.get(c.name, ())


def _copy_file(src: pathlib.Path, dest: pathlib.Path) -> None:
    """Hard-link (same file system: instant, no space) or copy, replacing atomically."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copy2(src, tmp)
    tmp.replace(dest)


def _make_writable(path: pathlib.Path) -> None:
    for p in [path, *path.rglob("*")]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | 0o200)


def _components() -> list[Component]:
    return [
        Component(
            "kubernetes",
            K8S_COMMANDS,
            (K8S_VERSION, _k8s_ldflags(), *_wrapper_inputs("k8s")),
            _build_k8s,
        ),
        Component("etcd", ("etcd",), (ETCD_VERSION, *_wrapper_inputs("etcd")), _build_etcd),
        Component("kwok", ("kwok",), (KWOK_VERSION,), _build_kwok),
        Component(
            "kueue",
            ("kueue",),
            (kueue_version(), _kueue_ldflags(kueue_version()), *KUEUE_CERT_PATCH),
            _build_kueue,
        ),
        Component("kuberay", ("ray-operator",), (KUBERAY_VERSION,), _build_kuberay),
        Component("helm", ("helm",), (HELM_VERSION,), _build_helm),
        Component(
            "charts",
            (),
            (KUEUE_VERSION, KUBERAY_VERSION, *CHART_SKIPPED, *KUBERAY_RBAC),
            _build_charts,
            assets=("charts",),
        ),
        Component(
            "containerd",
            CONTAINERD_COMMANDS,
            (CONTAINERD_VERSION, _containerd_ldflags(), *_wrapper_inputs("containerd")),
            _build_containerd,
        ),
        Component("pause", ("pause",), _wrapper_inputs("pause"), _build_pause),
        Component(
            "kubelet-api",
            (),
            (_staging_version(), KUBELET_API_PROTO),
            _build_kubelet_api,
            assets=("deviceplugin",),
        ),
    ]


def built_dir(root: pathlib.Path | None = None) -> pathlib.Path:
    """Return the stamp directory for this checkout's versions, failing if it is not built."""
    b = Builder(root)
    missing = [c.name for c in b.components if not b.is_built(c)]
    if missing:
        msg = (
            f"control plane not built for this checkout (missing: {', '.join(missing)}); "
            "run `taugrid dev build` first"
        )
        raise BuildError(msg)
    return b.dir


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `taugrid dev build`."""
    args = list(argv or [])
    only = [a.removeprefix("--only=") for a in args if a.startswith("--only=")]
    try:
        Builder().build_all(force="--force" in args, only=",".join(only).split(",") if only else ())
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
