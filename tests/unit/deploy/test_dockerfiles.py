"""The images' Dockerfiles and `.dockerignore` keep the house rules a linter would check.

hadolint is not installed here, so each rule is a small function over a parsed Dockerfile that
returns the problems it finds (empty: none). Every rule runs on the real files, where it must
find nothing, and on a snippet that breaks it, where it must find the problem: a rule that
could never fail would pass the first test just as well. Beyond hadolint, the Dockerfiles are
checked against the rest of the project: the entry point is a console script of
`pyproject.toml`, the copied packages are wheel packages, the user and port are the ones the
Helm chart's pod specs expect, the context allowlist lets through what is copied, and the image
names are the ones the docs tell people to build.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import shlex
import tomllib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[3]
DOCKER = REPO / "deploy" / "docker"
CHART = REPO / "deploy" / "helm" / "taugrid"
DOCKERIGNORE = REPO / ".dockerignore"
PLATFORM_DOC = REPO / "docs" / "platform.md"
IMAGES = ("controller", "agent")


# ---------------------------------------------------------------------- parsing
@dataclasses.dataclass(frozen=True)
class Instruction:
    """One instruction: its keyword, its `--flag=value` options, the rest as written."""

    line: int
    keyword: str
    flags: Mapping[str, tuple[str, ...]]
    args: str

    def flag(self, name: str) -> str | None:
        """Return the last value of `--name`, or None."""
        values = self.flags.get(name, ())
        return values[-1] if values else None


@dataclasses.dataclass(frozen=True)
class Stage:
    """One build stage: what it starts from, its name, its instructions after FROM."""

    line: int
    base: str
    name: str | None
    instructions: tuple[Instruction, ...]

    def all(self, keyword: str) -> list[Instruction]:
        """Return the stage's instructions with this keyword."""
        return [i for i in self.instructions if i.keyword == keyword]


@dataclasses.dataclass(frozen=True)
class Dockerfile:
    """A parsed Dockerfile: the ARGs declared before the first FROM, then the stages."""

    global_args: Mapping[str, str]
    stages: tuple[Stage, ...]

    @property
    def final(self) -> Stage:
        """Return the stage the image is made of."""
        return self.stages[-1]


_FLAGGED = frozenset({"FROM", "COPY", "ADD", "RUN"})


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join continuation lines; drop comments and blank lines (also inside continuations)."""
    out: list[tuple[int, str]] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not parts:
            start = number
        if stripped.endswith("\\"):
            parts.append(stripped[:-1].strip())
            continue
        parts.append(stripped)
        out.append((start, " ".join(p for p in parts if p)))
        parts = []
    if parts:
        out.append((start, " ".join(parts)))
    return out


def _instruction(line: int, text: str) -> Instruction:
    keyword, _, rest = text.partition(" ")
    keyword = keyword.upper()
    flags: dict[str, tuple[str, ...]] = {}
    rest = rest.strip()
    if keyword in _FLAGGED:
        while rest.startswith("--"):
            token, _, rest = rest.partition(" ")
            name, _, value = token[2:].partition("=")
            flags[name] = (*flags.get(name, ()), value)
            rest = rest.strip()
    return Instruction(line, keyword, flags, rest)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def parse(text: str) -> Dockerfile:
    """Parse a Dockerfile into global ARGs and stages (enough of the syntax for our rules)."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    current: tuple[int, str, str | None] | None = None
    body: list[Instruction] = []
    for line, logical in _logical_lines(text):
        ins = _instruction(line, logical)
        if ins.keyword == "FROM":
            if current is not None:
                stages.append(Stage(*current, tuple(body)))
            words = ins.args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            current, body = (line, words[0], name), []
        elif current is None:
            if ins.keyword == "ARG":
                key, _, default = ins.args.partition("=")
                global_args[key.strip()] = _unquote(default.strip())
        else:
            body.append(ins)
    if current is not None:
        stages.append(Stage(*current, tuple(body)))
    return Dockerfile(global_args, tuple(stages))


def exec_form(ins: Instruction) -> list[str] | None:
    """Return the JSON (exec) form of an instruction's arguments, or None for shell form."""
    if not ins.args.startswith("["):
        return None
    value = json.loads(ins.args)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return value


def copy_sources(ins: Instruction) -> list[str]:
    """Return the sources of a COPY/ADD (every argument but the destination)."""
    words = exec_form(ins) or shlex.split(ins.args)
    return words[:-1]


def bind_sources(ins: Instruction) -> list[str]:
    """Return the context paths a RUN mounts with `--mount=type=bind` (not from a stage)."""
    out: list[str] = []
    for mount in ins.flags.get("mount", ()):
        fields: dict[str, str] = {}
        for field in mount.split(","):
            key, _, value = field.partition("=")
            fields[key] = value
        if fields.get("type") == "bind" and "from" not in fields:
            out.append(fields.get("source") or fields.get("src") or ".")
    return out


def env_of(stage: Stage) -> dict[str, str]:
    """Return the `ENV key=value` pairs a stage sets (later ones win)."""
    env: dict[str, str] = {}
    for ins in stage.all("ENV"):
        for word in shlex.split(ins.args):
            key, sep, value = word.partition("=")
            if sep:
                env[key] = value
    return env


# ---------------------------------------------------------------------- .dockerignore
def _glob_regex(pattern: str) -> re.Pattern[str]:
    """Translate a .dockerignore pattern (Go filepath.Match plus `**`) into a regex."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("^") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


@dataclasses.dataclass(frozen=True)
class DockerIgnore:
    """The rules of a .dockerignore: the last pattern matching a path or a parent decides."""

    rules: tuple[tuple[bool, re.Pattern[str]], ...]

    @classmethod
    def parse(cls, text: str) -> DockerIgnore:
        """Read the patterns, as Docker does: comments dropped, `!` re-includes."""
        rules: list[tuple[bool, re.Pattern[str]]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = line[1:].strip() if negate else line
            pattern = pattern.strip("/")
            pattern = str(pathlib.PurePosixPath(pattern)) if pattern else "."
            rules.append((negate, _glob_regex(pattern)))
        return cls(tuple(rules))

    def ignored(self, path: str) -> bool:
        """Return whether `path` (relative, `/`-separated) stays out of the build context."""
        parts = pathlib.PurePosixPath(path).parts
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        ignored = False
        for negate, regex in self.rules:
            if any(regex.match(p) for p in prefixes):
                ignored = not negate
        return ignored


# ---------------------------------------------------------------------- project facts
def _pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _values() -> dict[str, Any]:
    data = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(data, dict)
    return data


def _chart() -> dict[str, Any]:
    data = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert isinstance(data, dict)
    return data


def _run_as_user(template: str) -> int:
    """Return the first `runAsUser` a chart template sets (pod or container level)."""
    found = re.search(r"runAsUser:\s*(\d+)", (CHART / "templates" / template).read_text())
    assert found is not None, f"{template} sets no runAsUser"
    return int(found.group(1))


SCRIPTS: Mapping[str, str] = _pyproject()["project"]["scripts"]
WHEEL_PACKAGES: frozenset[str] = frozenset(
    _pyproject()["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
)


@dataclasses.dataclass(frozen=True)
class Context:
    """What the rules check a Dockerfile against."""

    root: pathlib.Path
    ignore: DockerIgnore
    scripts: Mapping[str, str]
    packages: frozenset[str]


def _real_context() -> Context:
    return Context(REPO, DockerIgnore.parse(DOCKERIGNORE.read_text()), SCRIPTS, WHEEL_PACKAGES)


# ---------------------------------------------------------------------- rules
Rule = Callable[[Dockerfile, Context], list[str]]

_IMAGE_REF = re.compile(r"^(?P<name>[^@]+?)(?::(?P<tag>[\w][\w.-]*))?(?:@(?P<digest>sha256:.+))?$")


def rule_base_images_pinned(df: Dockerfile, ctx: Context) -> list[str]:
    """Every FROM names a tag or digest (directly or through a global ARG's default), never
    `latest`, unless it starts from an earlier stage (DL3006, DL3007)."""
    problems: list[str] = []
    earlier: set[str] = set()
    for stage in df.stages:
        problems.extend(_base_problems(df, stage, earlier))
        if stage.name:
            earlier.add(stage.name)
    return problems


def _base_problems(df: Dockerfile, stage: Stage, earlier: set[str]) -> list[str]:
    base = stage.base
    arg = re.fullmatch(r"\$\{?(\w+)\}?", base)
    if arg is not None:
        if not df.global_args.get(arg.group(1)):
            return [f"line {stage.line}: FROM {base}: no global ARG default"]
        base = df.global_args[arg.group(1)]
    if base in earlier:
        return []
    ref = _IMAGE_REF.match(base.rsplit("/", 1)[-1])
    if ref is None or (ref.group("tag") is None and ref.group("digest") is None):
        return [f"line {stage.line}: FROM {base}: pin a tag or a digest"]
    if ref.group("tag") == "latest":
        return [f"line {stage.line}: FROM {base}: `latest` is not a pin"]
    return []


def rule_stages_named_once(df: Dockerfile, ctx: Context) -> list[str]:
    """Stage names are unique (DL3024)."""
    names = [s.name for s in df.stages if s.name]
    return [f"stage {n!r} defined twice" for n in sorted({n for n in names if names.count(n) > 1})]


def rule_copy_from_earlier_stage(df: Dockerfile, ctx: Context) -> list[str]:
    """`COPY --from` names a stage defined before it (DL3022, DL3023)."""
    problems: list[str] = []
    earlier: set[str] = set()
    for stage in df.stages:
        for ins in stage.all("COPY"):
            source = ins.flag("from")
            if source is not None and source not in earlier:
                problems.append(f"line {ins.line}: COPY --from={source}: no earlier stage")
        if stage.name:
            earlier.add(stage.name)
    return problems


def rule_apt_get(df: Dockerfile, ctx: Context) -> list[str]:
    """`apt-get install` runs with -y and --no-install-recommends, after an `apt-get update`
    and before removing the package lists, in one RUN; never `apt` (DL3009, DL3014, DL3015,
    DL3027)."""
    problems: list[str] = []
    for stage in df.stages:
        for ins in stage.all("RUN"):
            text = ins.args
            if re.search(r"(^|[;&|(\s])apt\s+(install|update|upgrade)\b", text):
                problems.append(f"line {ins.line}: use apt-get, not apt, in scripts")
            if "apt-get install" not in text:
                continue
            for install in re.findall(r"apt-get install[^;&|]*", text):
                if "--no-install-recommends" not in install:
                    problems.append(
                        f"line {ins.line}: apt-get install without --no-install-recommends"
                    )
                if not re.search(r"\s(-y|--yes|-qq?y)\b", install):
                    problems.append(f"line {ins.line}: apt-get install without -y")
            if "apt-get update" not in text:
                problems.append(f"line {ins.line}: apt-get install without apt-get update")
            if "rm -rf /var/lib/apt/lists/*" not in text:
                problems.append(f"line {ins.line}: apt lists not removed in the same RUN")
    return problems


def rule_pip_no_cache(df: Dockerfile, ctx: Context) -> list[str]:
    """`pip install` runs with --no-cache-dir (DL3042); uv's pip interface with --no-cache."""
    problems: list[str] = []
    for stage in df.stages:
        for ins in stage.all("RUN"):
            for match in re.finditer(r"(\buv\s+)?\bpip3?\s+install\b[^;&|]*", ins.args):
                uv, command = match.group(1), match.group(0)
                needed = "--no-cache" if uv else "--no-cache-dir"
                if needed not in command:
                    problems.append(f"line {ins.line}: `{command.strip()}` without {needed}")
    return problems


def rule_final_user(df: Dockerfile, ctx: Context) -> list[str]:
    """The image's stage sets USER, numerically: `runAsNonRoot` cannot verify a name."""
    users = df.final.all("USER")
    if not users:
        return ["the final stage sets no USER"]
    uid = users[-1].args.split(":")[0]
    if not uid.isdigit():
        return [f"line {users[-1].line}: USER {users[-1].args}: use a numeric uid"]
    return []


def rule_copy_sources_in_context(df: Dockerfile, ctx: Context) -> list[str]:
    """COPY and bind mounts from the context name paths that exist and that .dockerignore
    lets through; no `COPY .` of the whole context, no ADD of local files (DL3020)."""
    problems: list[str] = []
    for stage in df.stages:
        for ins in stage.instructions:
            if ins.keyword == "ADD" and not all(
                s.startswith(("http://", "https://")) for s in copy_sources(ins)
            ):
                problems.append(f"line {ins.line}: ADD of local files; use COPY")
            if ins.keyword == "COPY" and ins.flag("from") is None:
                sources = copy_sources(ins)
            elif ins.keyword == "RUN":
                sources = bind_sources(ins)
            else:
                continue
            for source in sources:
                clean = source.strip("/") or "."
                if clean == ".":
                    problems.append(f"line {ins.line}: copies the whole context")
                    continue
                paths = sorted(ctx.root.glob(clean))
                if not paths:
                    problems.append(f"line {ins.line}: {source} does not exist")
                    continue
                for path in paths:
                    rel = path.relative_to(ctx.root).as_posix()
                    if ctx.ignore.ignored(rel):
                        problems.append(f"line {ins.line}: {rel} is excluded by .dockerignore")
    return problems


def copied_directories(df: Dockerfile, ctx: Context) -> list[tuple[int, str]]:
    """Return (line, path) of every directory copied from the context."""
    out: list[tuple[int, str]] = []
    for stage in df.stages:
        for ins in stage.all("COPY"):
            if ins.flag("from") is None:
                for source in copy_sources(ins):
                    clean = source.strip("/")
                    if clean not in {"", "."} and (ctx.root / clean).is_dir():
                        out.append((ins.line, clean))
    return out


def rule_copied_packages(df: Dockerfile, ctx: Context) -> list[str]:
    """Every copied directory is a real Python package of the wheel (pyproject's
    `[tool.hatch.build.targets.wheel] packages`), with an `__init__.py`."""
    problems: list[str] = []
    for line, path in copied_directories(df, ctx):
        if path not in ctx.packages:
            problems.append(f"line {line}: {path}/ is not a wheel package")
        elif not (ctx.root / path / "__init__.py").is_file():
            problems.append(f"line {line}: {path}/ has no __init__.py")
    return problems


def rule_entrypoint_is_a_script(df: Dockerfile, ctx: Context) -> list[str]:
    """The ENTRYPOINT is exec form and names a `[project.scripts]` entry whose package the
    image copies, so the console script exists and can import its module."""
    entries = df.final.all("ENTRYPOINT")
    if not entries:
        return ["the final stage has no ENTRYPOINT"]
    words = exec_form(entries[-1])
    if not words:
        return [f"line {entries[-1].line}: ENTRYPOINT in shell form (signals miss the process)"]
    script = words[0]
    if script not in ctx.scripts:
        return [f"line {entries[-1].line}: {script} is not in [project.scripts]"]
    package = ctx.scripts[script].split(":")[0].split(".")[0]
    if package not in {path for _, path in copied_directories(df, ctx)}:
        return [f"line {entries[-1].line}: {script} runs {package}, which is not copied"]
    return []


_COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|build-essential|make|cmake|python3?-dev|\S+-dev)\b")


def rule_runtime_lean(df: Dockerfile, ctx: Context) -> list[str]:
    """The image's stage installs no compilers or headers and writes no bytecode at run time
    (`PYTHONDONTWRITEBYTECODE=1`: the root filesystem is read-only)."""
    problems: list[str] = []
    for ins in df.final.all("RUN"):
        for install in re.findall(r"apt-get install[^;&|]*", ins.args):
            found = _COMPILERS.search(install)
            if found:
                problems.append(f"line {ins.line}: the runtime installs {found.group(0)}")
    if env_of(df.final).get("PYTHONDONTWRITEBYTECODE") != "1":
        problems.append("the final stage does not set PYTHONDONTWRITEBYTECODE=1")
    return problems


def rule_shell_hygiene(df: Dockerfile, ctx: Context) -> list[str]:
    """A RUN with a pipe has pipefail set (DL4006); no sudo (DL3004); WORKDIR is absolute
    (DL3000)."""
    problems: list[str] = []
    for stage in df.stages:
        pipefail = False
        for ins in stage.instructions:
            if ins.keyword == "SHELL":
                pipefail = "pipefail" in ins.args
            elif ins.keyword == "RUN":
                if re.search(r"(?<!\|)\|(?!\|)", ins.args) and not pipefail:
                    problems.append(f"line {ins.line}: a pipe without SHELL -o pipefail")
                if re.search(r"\bsudo\b", ins.args):
                    problems.append(f"line {ins.line}: sudo")
            elif ins.keyword == "WORKDIR" and not ins.args.startswith(("/", "$")):
                problems.append(f"line {ins.line}: WORKDIR {ins.args} is relative")
    return problems


RULES: tuple[Rule, ...] = (
    rule_base_images_pinned,
    rule_stages_named_once,
    rule_copy_from_earlier_stage,
    rule_apt_get,
    rule_pip_no_cache,
    rule_final_user,
    rule_copy_sources_in_context,
    rule_copied_packages,
    rule_entrypoint_is_a_script,
    rule_runtime_lean,
    rule_shell_hygiene,
)


def _name(rule: Rule) -> str:
    return str(getattr(rule, "__name__", "rule")).removeprefix("rule_")


def _dockerfile(image: str) -> Dockerfile:
    return parse((DOCKER / f"{image}.Dockerfile").read_text())


# ---------------------------------------------------------------------- the real files
@pytest.mark.parametrize("image", IMAGES)
@pytest.mark.parametrize("rule", RULES, ids=_name)
def test_the_dockerfile_keeps_the_rule(image: str, rule: Rule) -> None:
    """Each image's Dockerfile breaks none of the house rules."""
    assert rule(_dockerfile(image), _real_context()) == []


@pytest.mark.parametrize("image", IMAGES)
def test_the_dockerfile_builds_from_a_venv_and_a_slim_runtime(image: str) -> None:
    """A builder stage syncs the locked set with uv; the runtime copies only the venv from it."""
    df = _dockerfile(image)
    assert len(df.stages) >= 2
    runs = " ".join(i.args for s in df.stages[:-1] for i in s.all("RUN"))
    assert "uv sync --frozen --no-dev --no-editable" in runs
    final_copies = [
        (i.flag("from"), copy_sources(i)) for i in df.final.all("COPY") if i.flag("from")
    ]
    assert final_copies == [("builder", ["/opt/venv"])]
    assert df.global_args["PYTHON_IMAGE"] == "python:3.11-slim-bookworm"
    assert df.final.base == "${PYTHON_IMAGE}"


@pytest.mark.parametrize(
    ("image", "template", "non_root"),
    [
        ("controller", "controller-deployment.yaml", True),
        ("agent", "agent-daemonset.yaml", False),
    ],
    ids=[
        "the controller runs as the chart's non-root uid",
        "the agent runs as root like the chart",
    ],
)
def test_the_user_is_the_one_the_chart_runs(image: str, template: str, non_root: bool) -> None:
    """USER matches the chart's runAsUser (65532 for the controller, 0 for the agent)."""
    uid = int(_dockerfile(image).final.all("USER")[-1].args.split(":")[0])
    assert _run_as_user(template) == uid
    assert non_root == (uid != 0)


@pytest.mark.parametrize("image", IMAGES)
def test_entrypoint_port_and_version_agree_with_the_chart(image: str) -> None:
    """The ENTRYPOINT is the chart's default command, EXPOSE its port, the VERSION label
    default the chart's appVersion and the project's version."""
    df = _dockerfile(image)
    values = _values()[image]
    assert values["command"] == exec_form(df.final.all("ENTRYPOINT")[-1])
    assert [str(values["port"])] == [i.args for i in df.final.all("EXPOSE")]
    versions = [i.args for i in df.final.all("ARG") if i.args.startswith("VERSION=")]
    assert [f"VERSION={_chart()['appVersion']}"] == versions
    assert _chart()["appVersion"] == _pyproject()["project"]["version"]


@pytest.mark.parametrize("image", IMAGES)
def test_the_image_carries_oci_labels(image: str) -> None:
    """The runtime stage labels title, version, revision, source, licence and base image."""
    labels = " ".join(i.args for i in _dockerfile(image).final.all("LABEL"))
    for key in ("title", "version", "revision", "source", "licenses", "base.name"):
        assert f"org.opencontainers.image.{key}=" in labels


@pytest.mark.parametrize("image", IMAGES)
def test_the_docs_build_the_images_the_chart_pulls(image: str) -> None:
    """docs/platform.md builds and pushes each image under the chart's default repository
    name, and the chart README names the same Dockerfile."""
    repository = _values()[image]["image"]["repository"]
    dockerfile = f"deploy/docker/{image}.Dockerfile"
    builds = [
        line
        for line in PLATFORM_DOC.read_text().splitlines()
        if "docker build" in line and dockerfile in line
    ]
    assert builds, f"docs/platform.md has no `docker build -f {dockerfile}` line"
    assert all(f"/{repository}:" in line for line in builds), builds
    assert f"{image}.image.repository=$REGISTRY/{repository}" in PLATFORM_DOC.read_text()
    assert dockerfile in (CHART / "README.md").read_text()


# ---------------------------------------------------------------------- .dockerignore
@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".git/HEAD",
        "tests/unit/test_spec.py",
        "dist/taugrid-0.1.0-py3-none-any.whl",
        "build/lib/controller/app.py",
        "taugrid.egg-info/PKG-INFO",
        "controller/__pycache__/app.cpython-311.pyc",
        "agent/probing/__pycache__/nvml.cpython-311.pyc",
        ".mypy_cache/3.11/cache.db",
        ".ruff_cache/CACHEDIR.TAG",
        ".pytest_cache/README.md",
        "devcluster/go/etcd/go.mod",
        "docs/platform.md",
    ],
)
def test_the_context_leaves_out(path: str) -> None:
    """The build context excludes virtual environments, git, tests, caches and build outputs."""
    assert DockerIgnore.parse(DOCKERIGNORE.read_text()).ignored(path)


@pytest.mark.parametrize(
    "path",
    [
        "pyproject.toml",
        "uv.lock",
        "README.md",
        "controller/app.py",
        "controller/assets/index.html",
        "controller/assets/tau.py",
        "agent/probing/__init__.py",
        "shared/xid.py",
    ],
)
def test_the_context_keeps(path: str) -> None:
    """The build context keeps the metadata, the lock and every file of the packages,
    package data (the web page, the `tau` script) included."""
    assert not DockerIgnore.parse(DOCKERIGNORE.read_text()).ignored(path)


@pytest.mark.parametrize(
    ("patterns", "path", "ignored"),
    [
        ("*", "a/b.py", True),
        ("*\n!a", "a/b.py", False),
        ("*\n!a\n**/__pycache__", "a/x/__pycache__/m.pyc", True),
        ("**/*.pyc", "m.pyc", True),
        ("build", "a/build/x", False),
        ("**/build", "a/build/x", True),
        ("docs/*.md", "docs/x.md", True),
        ("docs/*.md", "docs/sub/x.md", False),
        ("!a\n*", "a/b.py", True),
        ("# a comment\n\n.git/", ".git/HEAD", True),
    ],
    ids=[
        "a star excludes everything",
        "a later exception re-includes a directory",
        "an exclusion after the exception wins inside it",
        "a double star matches at the top too",
        "a plain name matches only at the top",
        "a double star name matches at any depth",
        "a star does not cross a slash",
        "a star stops at one directory level",
        "the last matching rule wins",
        "comments and trailing slashes are read as Docker does",
    ],
)
def test_the_ignore_matcher_reads_patterns_as_docker(
    patterns: str, path: str, ignored: bool
) -> None:
    """The matcher the context checks rely on follows Docker's .dockerignore semantics."""
    assert ignored == DockerIgnore.parse(patterns).ignored(path)


# ---------------------------------------------------------------------- each rule can fail
_GOOD_HEAD = """ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE} AS builder
COPY pyproject.toml uv.lock README.md ./
COPY controller/ controller/
"""
_GOOD_TAIL = """FROM ${PYTHON_IMAGE} AS runtime
COPY --from=builder /opt/venv /opt/venv
ENV PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
ENTRYPOINT ["taugrid-controller"]
"""

_RM_LISTS = "rm -rf /var/lib/apt/lists/*"

BROKEN: list[tuple[Rule, str, str]] = [
    (rule_base_images_pinned, "FROM python AS base\n" + _GOOD_TAIL, "pin a tag"),
    (rule_base_images_pinned, "FROM python:latest\n", "`latest`"),
    (rule_base_images_pinned, "ARG IMG\nFROM ${IMG}\n", "no global ARG default"),
    (rule_stages_named_once, "FROM a:1 AS x\nFROM b:1 AS x\n", "defined twice"),
    (rule_copy_from_earlier_stage, "FROM a:1 AS x\nCOPY --from=y /a /a\n", "no earlier stage"),
    (rule_apt_get, f"FROM a:1\nRUN apt-get update && apt-get install -y curl && {_RM_LISTS}\n",
     "--no-install-recommends"),
    (rule_apt_get, "FROM a:1\nRUN apt-get update && apt-get install -y --no-install-recommends c\n",
     "lists not removed"),
    (rule_apt_get, f"FROM a:1\nRUN apt-get install --no-install-recommends curl && {_RM_LISTS}\n",
     "without -y"),
    (rule_apt_get, "FROM a:1\nRUN apt install -y curl\n", "not apt"),
    (rule_pip_no_cache, "FROM a:1\nRUN pip install aiohttp\n", "--no-cache-dir"),
    (rule_pip_no_cache, "FROM a:1\nRUN uv pip install aiohttp\n", "--no-cache"),
    (rule_final_user, "FROM a:1\nRUN true\n", "sets no USER"),
    (rule_final_user, "FROM a:1\nUSER taugrid\n", "numeric uid"),
    (rule_copy_sources_in_context, "FROM a:1\nCOPY nonexistent/ /x/\n", "does not exist"),
    (rule_copy_sources_in_context, "FROM a:1\nCOPY tests/ /x/\n", "excluded by .dockerignore"),
    (rule_copy_sources_in_context, "FROM a:1\nCOPY . /src\n", "whole context"),
    (rule_copy_sources_in_context, "FROM a:1\nADD shared/ /x/\n", "use COPY"),
    (rule_copy_sources_in_context, "FROM a:1\nRUN --mount=type=bind,source=setup.py true\n",
     "does not exist"),
    (rule_copied_packages, "FROM a:1\nCOPY docs/ docs/\n", "not a wheel package"),
    (rule_entrypoint_is_a_script, _GOOD_HEAD + _GOOD_TAIL.replace(
        "taugrid-controller", "taugrid-server"), "not in [project.scripts]"),
    (rule_entrypoint_is_a_script, _GOOD_HEAD.replace("controller/", "shared/")
     + _GOOD_TAIL, "not copied"),
    (rule_entrypoint_is_a_script, "FROM a:1\nENTRYPOINT taugrid-controller\n", "shell form"),
    (rule_runtime_lean, _GOOD_HEAD + _GOOD_TAIL + "RUN apt-get install -y gcc\n", "gcc"),
    (rule_runtime_lean, _GOOD_HEAD + _GOOD_TAIL.replace(
        "ENV PYTHONDONTWRITEBYTECODE=1", "ENV A=1"), "PYTHONDONTWRITEBYTECODE"),
    (rule_shell_hygiene, "FROM a:1\nRUN curl -s x | sh\n", "pipefail"),
    (rule_shell_hygiene, "FROM a:1\nRUN sudo true\n", "sudo"),
    (rule_shell_hygiene, "FROM a:1\nWORKDIR src\n", "relative"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("rule", "text", "expected"),
    BROKEN,
    ids=[f"{_name(r)}: {e}" for r, _, e in BROKEN],
)
def test_each_rule_finds_what_breaks_it(rule: Rule, text: str, expected: str) -> None:
    """A Dockerfile breaking a rule yields a problem that says what is wrong."""
    problems = rule(parse(text), _real_context())
    assert any(expected in p for p in problems), problems


def test_every_rule_has_a_breaking_example() -> None:
    """No rule goes untested for its ability to fail."""
    assert set(RULES) == {rule for rule, _, _ in BROKEN}


def test_the_good_example_keeps_every_rule() -> None:
    """The examples above break one rule each: their common parts keep them all."""
    df = parse(_GOOD_HEAD + _GOOD_TAIL)
    problems: Sequence[str] = [p for rule in RULES for p in rule(df, _real_context())]
    assert problems == []


def test_the_parser_joins_continuations_and_skips_comments() -> None:
    """Continuation lines join, comment lines inside them vanish, flags are split off."""
    df = parse(
        "# syntax=docker/dockerfile:1\nARG B=x:1\nFROM ${B} AS s\n"
        "RUN --mount=type=cache,target=/c \\\n  # note\n  echo a \\\n  && echo b\n"
    )
    run = df.final.all("RUN")[0]
    assert dict(df.global_args) == {"B": "x:1"}
    assert (df.final.name, df.final.base) == ("s", "${B}")
    assert run.args == "echo a && echo b"
    assert run.flags["mount"] == ("type=cache,target=/c",)
