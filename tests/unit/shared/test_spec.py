"""tau.yaml models: parsing, field-naming errors, warnings, schema, hash, docs and the CRD."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
import yaml

from shared import patterns, specdoc
from shared import spec as specs

ROOT = pathlib.Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "specs"
DIGEST = "@sha256:" + "ab" * 32
BASE = f"name: demo\nimage: registry.example.com/train{DIGEST}\ncommand: [python, train.py]\n"


def _fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def _parse(extra: str = "", base: str = BASE) -> specs.TauSpec:
    return specs.parse_spec((base + extra).encode(), "application/yaml").spec


# ---------------------------------------------------------------- valid specs


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        pytest.param(
            "job.yaml",
            {
                "kind": specs.RunKind.JOB,
                "command": "python train.py --epochs 10",
                "env": {"LEARNING_RATE": "0.001", "EPOCHS": "10"},
                "resources": {"gpus": 1, "cpu": "4", "memory": "32Gi"},
                "workers": 1,
                "queue": "team-a",
                "priority": "high",
                "timeout_s": 7200,
                "checkpoint_dir": "/scratch/mnist",
                "retry_when": ["NodeFailure"],
                "retry_max": 3,
            },
            id="a single-GPU job with a shell command, volumes and a checkpoint",
        ),
        pytest.param(
            "pytorch.yaml",
            {
                "kind": specs.RunKind.PYTORCH,
                "command": ["torchrun", "train.py"],
                "env": {},
                "resources": {"gpus": 8, "cpu": "32", "memory": "512Gi"},
                "workers": 2,
                "queue": "default",
                "priority": None,
                "timeout_s": None,
                "checkpoint_dir": "/ckpt",
                "retry_when": ["NodeFailure", "Evicted"],
                "retry_max": 5,
            },
            id="a two-node pytorch run with an explicit retry policy",
        ),
        pytest.param(
            "ray.yaml",
            {
                "kind": specs.RunKind.RAY,
                "command": ["python", "tune.py", "--samples", "16"],
                "env": {},
                "resources": {"gpus": 2, "cpu": "8", "memory": "64Gi"},
                "workers": 2,
                "queue": "ray",
                "priority": None,
                "timeout_s": None,
                "checkpoint_dir": None,
                "retry_when": ["NodeFailure"],
                "retry_max": 3,
            },
            id="a ray run with integer arguments taken as text",
        ),
    ],
)
def test_example_specs_parse(fixture: str, expected: dict[str, Any]) -> None:
    """The example specs validate, with defaults filled in and numbers-as-text converted."""
    spec = specs.parse_spec(_fixture(fixture), None).spec
    actual = {
        "kind": spec.kind,
        "command": spec.command,
        "env": spec.env,
        "resources": spec.resources.model_dump(),
        "workers": spec.workers,
        "queue": spec.queue,
        "priority": spec.priority,
        "timeout_s": spec.timeout_s,
        "checkpoint_dir": spec.checkpoint.dir if spec.checkpoint else None,
        "retry_when": spec.retry.when,
        "retry_max": spec.retry.max_attempts,
    }
    assert expected == actual


def test_json_body_gives_the_same_spec_as_yaml() -> None:
    """A JSON body with the same fields yields an equal spec."""
    from_yaml = specs.parse_spec(_fixture("pytorch.yaml"), "application/yaml").spec
    body = json.dumps(specs.spec_to_wire(from_yaml)).encode()
    from_json = specs.parse_spec(body, "application/json; charset=utf-8").spec
    assert from_yaml == from_json


def test_wire_form_round_trips() -> None:
    """What goes into a TauRun's spec validates back to the same model."""
    spec = specs.parse_spec(_fixture("job.yaml")).spec
    assert spec == specs.validate_spec(specs.spec_to_wire(spec)).spec


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        pytest.param("", ["python", "train.py"], id="exec form runs as given"),
        pytest.param("args: [--lr, '0.1']\n", ["python", "train.py", "--lr", "0.1"], id="args"),
    ],
)
def test_exec_form_argv(extra: str, expected: list[str]) -> None:
    """A list command is exec form; args are appended."""
    assert expected == _parse(extra).argv


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        pytest.param("", ["/bin/sh", "-c", "echo hi"], id="a string runs under sh -c"),
        pytest.param(
            "args: [a, 2]\n",
            ["/bin/sh", "-c", "echo hi", "demo", "a", "2"],
            id="args become positional parameters after the run name as $0",
        ),
    ],
)
def test_shell_form_argv(extra: str, expected: list[str]) -> None:
    """A string command runs under /bin/sh -c."""
    base = f"name: demo\nimage: i{DIGEST}\ncommand: echo hi\n"
    assert expected == _parse(extra, base).argv


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        pytest.param("kind: pytorch\n", 1, id="no GPUs means one process per node"),
        pytest.param("kind: pytorch\nresources: {gpus: 4}\n", 4, id="one process per GPU"),
        pytest.param(
            "kind: pytorch\nresources: {gpus: 4}\nnprocPerNode: 2\n", 2, id="an explicit count"
        ),
    ],
)
def test_nproc_per_node_defaults_to_gpus(extra: str, expected: int) -> None:
    """nprocPerNode defaults to the GPUs per worker, at least 1."""
    assert expected == _parse(extra).effective_nproc_per_node


# ---------------------------------------------------------------- invalid specs

FIVE_MIB = b"name: x\n" + b"#" * (5 * 1024 * 1024)
ALIAS_BOMB = (
    BASE
    + 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "".join(
        f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
        for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
    )
)


@pytest.mark.parametrize(
    ("body", "content_type", "kind", "field", "message"),
    [
        pytest.param(
            b"name: x\ncommand: [a]\n",
            None,
            specs.SpecErrorKind.INVALID,
            "image",
            "is required",
            id="a missing image is named",
        ),
        pytest.param(
            (BASE + "resources: {gpus: -1}\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "resources.gpus",
            "must be at least 0, not -1",
            id="negative GPUs are refused",
        ),
        pytest.param(
            (BASE + "gpu: 1\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "gpu",
            "unknown field; allowed here: apiVersion, kind, name",
            id="an unknown top-level field lists the allowed ones",
        ),
        pytest.param(
            (BASE + "retry: {on: [AppError]}\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "retry.on",
            "unknown field; allowed here: maxAttempts, when, backoff",
            id="on in retry is read as the key on and refused as unknown",
        ),
        pytest.param(
            (BASE + "workers: two\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "workers",
            "must be a whole number, not string 'two'",
            id="a string where a number belongs",
        ),
        pytest.param(
            (BASE + "workers: '2'\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "workers",
            "must be a whole number",
            id="a quoted number is not a number",
        ),
        pytest.param(
            (BASE + "resources: {gpus: true}\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "resources.gpus",
            "must be a whole number, not boolean True",
            id="a boolean is not a number",
        ),
        pytest.param(
            (BASE + "volumes: [{claim: d, mountPath: /d, readOnly: yes}]\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "volumes[0].readOnly",
            "must be true or false, not string 'yes'",
            id="yes is not a boolean in YAML 1.2",
        ),
        pytest.param(
            (BASE + "resources: 4\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "resources",
            "must be a mapping, not number 4",
            id="a number where a mapping belongs",
        ),
        pytest.param(
            b"name: x\nimage: i\ncommand: {run: x}\n",
            None,
            specs.SpecErrorKind.INVALID,
            "command",
            "list of strings (exec form) or one string",
            id="a mapping as the command",
        ),
        pytest.param(
            b"name: x\nimage: i\ncommand: [python, [a]]\n",
            None,
            specs.SpecErrorKind.INVALID,
            "command[1]",
            "must be a string, not list ['a']",
            id="a list inside the command list names its index",
        ),
        pytest.param(
            b"name: x\nimage: i\ncommand: 5\n",
            None,
            specs.SpecErrorKind.INVALID,
            "command",
            "list of strings (exec form) or one string",
            id="a bare number as the command",
        ),
        pytest.param(
            b"name: x\nimage: i\ncommand: []\n",
            None,
            specs.SpecErrorKind.INVALID,
            "command",
            "list of strings (exec form) or one string",
            id="an empty command list",
        ),
        pytest.param(
            b"name: x\nimage: i\ncommand: '  '\n",
            None,
            specs.SpecErrorKind.INVALID,
            "command",
            "must not be empty",
            id="a blank command string",
        ),
        pytest.param(
            ALIAS_BOMB.encode(),
            None,
            specs.SpecErrorKind.MALFORMED,
            "",
            "alias bomb",
            id="a YAML alias bomb",
        ),
        pytest.param(
            FIVE_MIB,
            None,
            specs.SpecErrorKind.TOO_LARGE,
            "",
            f"the limit is {specs.MAX_SPEC_BYTES}",
            id="a five MiB body names the limit",
        ),
        pytest.param(
            b"name: caf\xe9\nimage: i\ncommand: [a]\n",
            None,
            specs.SpecErrorKind.MALFORMED,
            "",
            "not UTF-8 (invalid byte at offset 9)",
            id="non-UTF-8 input",
        ),
        pytest.param(
            (BASE + "name: other\n").encode(),
            None,
            specs.SpecErrorKind.MALFORMED,
            "name",
            "duplicate key 'name' (first at line 1) (line 4)",
            id="a duplicate key names the key and its lines",
        ),
        pytest.param(
            b'{"name": "x", "name": "y", "image": "i", "command": ["a"]}',
            "application/json",
            specs.SpecErrorKind.MALFORMED,
            "name",
            "duplicate key 'name'",
            id="a duplicate key in JSON",
        ),
        pytest.param(
            b'{"name": "x", "image": "i", "command": ["a"], "workers": NaN}',
            "application/json",
            specs.SpecErrorKind.MALFORMED,
            "",
            "NaN is not a number JSON allows",
            id="NaN in JSON",
        ),
        pytest.param(
            b'{"name": "x",',
            "application/json",
            specs.SpecErrorKind.MALFORMED,
            "",
            "invalid JSON",
            id="truncated JSON",
        ),
        pytest.param(
            b"[" * 100_000,
            "application/json",
            specs.SpecErrorKind.MALFORMED,
            "",
            "nesting too deep",
            id="JSON nested a hundred thousand deep",
        ),
        pytest.param(
            BASE.encode(),
            "application/xml",
            specs.SpecErrorKind.UNSUPPORTED_MEDIA_TYPE,
            "",
            "content type 'application/xml' is not supported",
            id="an unsupported content type",
        ),
        pytest.param(
            BASE.encode(),
            "application/yaml; charset=latin-1",
            specs.SpecErrorKind.UNSUPPORTED_MEDIA_TYPE,
            "",
            "send UTF-8",
            id="a charset other than UTF-8",
        ),
        pytest.param(
            b"- name: x\n",
            None,
            specs.SpecErrorKind.INVALID,
            "",
            "must be a mapping of tau.yaml fields",
            id="a list document",
        ),
        pytest.param(
            b"",
            None,
            specs.SpecErrorKind.INVALID,
            "",
            "not an empty document",
            id="an empty document",
        ),
        pytest.param(
            (BASE + "a: !!python/object/apply:os.system [ls]\n").encode(),
            None,
            specs.SpecErrorKind.MALFORMED,
            "a",
            "tag !!python/object/apply:os.system is not allowed",
            id="a python tag",
        ),
        pytest.param(
            b"name: Demo_Run\nimage: i\ncommand: [a]\n",
            None,
            specs.SpecErrorKind.INVALID,
            "name",
            "at most 40 lower-case letters",
            id="a name with capitals and underscores",
        ),
        pytest.param(
            f"name: {'a' * 41}\nimage: i\ncommand: [a]\n".encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "name",
            "at most 40",
            id="a name of 41 characters",
        ),
        pytest.param(
            b"name: 1abc\nimage: i\ncommand: [a]\n",
            None,
            specs.SpecErrorKind.INVALID,
            "name",
            "starting with a letter",
            id="a name starting with a digit",
        ),
        pytest.param(
            b"name: x\nimage: 'my image'\ncommand: [a]\n",
            None,
            specs.SpecErrorKind.INVALID,
            "image",
            "is not an image reference",
            id="an image with a space",
        ),
        pytest.param(
            (BASE + "env: {TAU_RUN: x}\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "env.TAU_RUN",
            "names starting TAU_ are reserved",
            id="a TAU_ env name is reserved",
        ),
        pytest.param(
            (BASE + "env: {1X: x}\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "env.1X",
            "not a valid variable name",
            id="an env name starting with a digit",
        ),
        pytest.param(
            (BASE + "env: {LR: 0.10}\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "env.LR",
            "quote it",
            id="a decimal env value must be quoted",
        ),
        pytest.param(
            (BASE + "kind: pytorch\nenv: {MASTER_PORT: '1'}\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "env.MASTER_PORT",
            "set by TauGrid for torchrun rendezvous",
            id="a rendezvous env name in a pytorch run",
        ),
        pytest.param(
            (BASE + "workers: 0\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "workers",
            "must be at least 1",
            id="zero workers",
        ),
        pytest.param(
            (BASE + "workers: 100000\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "workers",
            f"must be at most {specs.MAX_WORKERS}",
            id="a typo of a hundred thousand workers",
        ),
        pytest.param(
            (BASE + "kind: mpi\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "kind",
            "must be one of job, pytorch or ray, not 'mpi'",
            id="an unknown kind",
        ),
        pytest.param(
            (BASE + "apiVersion: taugrid.dev/v2\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "apiVersion",
            "must be one of taugrid.dev/v1alpha1",
            id="another apiVersion",
        ),
        pytest.param(
            (BASE + "nprocPerNode: 2\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "nprocPerNode",
            "only to kind: pytorch",
            id="nprocPerNode outside pytorch",
        ),
        pytest.param(
            (BASE + "retry: {when: [Unknown]}\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "retry.when",
            "Unknown is never retried",
            id="Unknown in retry.when",
        ),
        pytest.param(
            (BASE + "retry: {when: [NodeFailure, Preempted]}\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "retry.when[1]",
            "must be one of NodeFailure, Evicted, OOMKilled, AppError or Timeout",
            id="an unknown failure class names its index",
        ),
        pytest.param(
            (BASE + "retry: {when: [AppError, AppError]}\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "retry.when",
            "may appear once",
            id="a repeated failure class",
        ),
        pytest.param(
            (BASE + "retry: {maxAttempts: 0}\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "retry.maxAttempts",
            "must be at least 1",
            id="zero attempts",
        ),
        pytest.param(
            (BASE + "timeout: 3600\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "timeout",
            "has no unit",
            id="a duration without a unit",
        ),
        pytest.param(
            (BASE + "timeout: 1:30\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "timeout",
            "'1:30' is not a duration; write a number with a unit",
            id="1:30 is not a duration",
        ),
        pytest.param(
            (BASE + "retry: {backoff: 5 minutes}\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "retry.backoff",
            "is not a duration",
            id="a duration in words",
        ),
        pytest.param(
            (BASE + "resources: {memory: 16GB}\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "resources.memory",
            "is not a Kubernetes quantity",
            id="a memory size in GB",
        ),
        pytest.param(
            (BASE + "resources: {cpu: 0}\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "resources.cpu",
            "must be more than zero",
            id="zero CPUs",
        ),
        pytest.param(
            (BASE + "volumes: [{claim: d, mountPath: data}]\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "volumes[0].mountPath",
            "must be an absolute path",
            id="a relative mountPath",
        ),
        pytest.param(
            (BASE + "volumes: [{claim: d, mountPath: /dev/shm}]\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "volumes[0].mountPath",
            "is reserved",
            id="a volume over /dev/shm",
        ),
        pytest.param(
            (BASE + "volumes: [{claim: a, mountPath: /d}, {claim: b, mountPath: /d/}]\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "volumes[1].mountPath",
            "already used by volumes[0]",
            id="two volumes on one path",
        ),
        pytest.param(
            (BASE + "volumes: [{claim: Bad_Claim, mountPath: /d}]\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "volumes[0].claim",
            "not a valid Kubernetes object name",
            id="an invalid claim name",
        ),
        pytest.param(
            (
                BASE
                + "volumes: [{claim: c, mountPath: /data}]\n"
                + "checkpoint: {dir: /ckpt, volume: c}\n"
            ).encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "checkpoint.dir",
            "is not under the mountPath of volume 'c' (/data)",
            id="a checkpoint dir outside its volume",
        ),
        pytest.param(
            (
                BASE
                + "volumes: [{claim: c, mountPath: /data, readOnly: true}]\n"
                + "checkpoint: {dir: /data/ckpt, volume: c}\n"
            ).encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "checkpoint.volume",
            "mounted readOnly",
            id="a checkpoint on a read-only volume",
        ),
        pytest.param(
            (
                BASE
                + "volumes: [{claim: d, mountPath: /data}]\n"
                + "checkpoint: {dir: /data, volume: c}\n"
            ).encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "checkpoint.dir",
            "already in use",
            id="a checkpoint volume mounted over another volume",
        ),
        pytest.param(
            (BASE + "labels: {taugrid.dev/run: x}\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "labels.taugrid.dev/run",
            "reserved",
            id="a label in our own domain",
        ),
        pytest.param(
            (BASE + "labels: {team: 'a b'}\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "labels.team",
            "must be at most 63 letters",
            id="a label value with a space",
        ),
        pytest.param(
            (BASE + "env: {1: x}\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "env",
            "key 1 must be a string",
            id="a number as an env name",
        ),
        pytest.param(
            (BASE + "true: x\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "",
            "key true must be a string",
            id="true as a top-level key",
        ),
        pytest.param(
            (BASE + "queue: Team_A\n").encode(),
            None,
            specs.SpecErrorKind.INVALID,
            "queue",
            "not a valid name",
            id="an invalid queue name",
        ),
    ],
)
def test_invalid_specs_name_the_field(
    body: bytes,
    content_type: str | None,
    kind: specs.SpecErrorKind,
    field: str,
    message: str,
) -> None:
    """Each invalid spec raises a SpecError of the right kind, naming the field and the rule."""
    with pytest.raises(specs.SpecError) as caught:
        specs.parse_spec(body, content_type)
    error = caught.value
    assert (kind, field) == (error.kind, error.field)
    assert message in error.problems[0].message


def test_every_problem_is_reported_at_once() -> None:
    """Several mistakes give several problems, so a researcher fixes them in one round."""
    body = b"name: x\ncommand: [a]\nresources: {gpus: -2}\nretry: {on: [AppError]}\n"
    with pytest.raises(specs.SpecError) as caught:
        specs.parse_spec(body)
    fields = sorted(problem.field for problem in caught.value.problems)
    expected = ["image", "resources.gpus", "retry.on"]
    assert expected == fields


def test_problems_have_a_wire_form() -> None:
    """Problems serialise as {field, message} for the HTTP error body."""
    with pytest.raises(specs.SpecError) as caught:
        specs.parse_spec(b"name: x\ncommand: [a]\n")
    expected = [{"field": "image", "message": "is required"}]
    assert expected == [problem.as_dict() for problem in caught.value.problems]


# ---------------------------------------------------------------- durations and quantities


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("90s", 90, id="seconds"),
        pytest.param("30m", 1800, id="minutes"),
        pytest.param("2h", 7200, id="hours"),
        pytest.param("1h30m", 5400, id="hours and minutes"),
        pytest.param("2d", 172_800, id="days"),
        pytest.param("0s", 0, id="zero"),
    ],
)
def test_durations_parse_to_seconds(text: str, expected: int) -> None:
    """Durations with units become whole seconds."""
    assert expected == specs.parse_duration(text)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("90", id="no unit"),
        pytest.param("1:30", id="clock notation"),
        pytest.param("30m1h", id="units out of order"),
        pytest.param("400d", id="longer than a year"),
        pytest.param("1.5h", id="a fraction"),
    ],
)
def test_bad_durations_are_refused(text: str) -> None:
    """Anything but integer amounts with d, h, m, s in that order is refused."""
    with pytest.raises(ValueError, match=r"duration|longer than a year"):
        specs.parse_duration(text)


def test_duration_properties() -> None:
    """timeout_s and retry.backoff_s expose the durations in seconds."""
    spec = _parse("timeout: 1h30m\nretry: {backoff: 45s}\n")
    expected = (5400, 45)
    assert expected == (spec.timeout_s, spec.retry.backoff_s)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("500m", 0.5, id="millicores"),
        pytest.param("4", 4.0, id="whole cores"),
        pytest.param("1.5", 1.5, id="a decimal"),
        pytest.param("16Gi", 16 * 2.0**30, id="binary gibibytes"),
        pytest.param("2G", 2e9, id="decimal gigabytes"),
    ],
)
def test_quantities_parse(text: str, expected: float) -> None:
    """Kubernetes quantities parse to their value."""
    assert expected == specs.parse_quantity(text)


# ---------------------------------------------------------------- warnings


@pytest.mark.parametrize(
    ("body", "expected_fragments"),
    [
        pytest.param(
            b"name: x\nimage: python:3.12\ncommand: [a]\nretry: {maxAttempts: 1}\n",
            ["not pinned by digest"],
            id="a tagged image is accepted with a warning",
        ),
        pytest.param(
            f"name: x\nimage: python{DIGEST}\ncommand: [a]\nretry: {{maxAttempts: 1}}\n".encode(),
            [],
            id="a pinned image without retries warns about nothing",
        ),
        pytest.param(
            f"name: x\nimage: p{DIGEST}\ncommand: [a]\n".encode(),
            ["no checkpoint is configured"],
            id="retries without a checkpoint restart from scratch",
        ),
        pytest.param(
            f"name: x\nimage: p{DIGEST}\ncommand: [a]\ncheckpoint: {{dir: /ckpt}}\n".encode(),
            ["lost with the pod"],
            id="a checkpoint on the pod's own disk",
        ),
        pytest.param(
            f"name: x\nimage: p{DIGEST}\ncommand: [a]\nworkers: 2\n"
            "checkpoint: {dir: /ckpt, volume: c}\n".encode(),
            ["must be ReadWriteMany"],
            id="several workers sharing a checkpoint volume",
        ),
    ],
)
def test_warnings(body: bytes, expected_fragments: list[str]) -> None:
    """Valid but risky specs come back with warnings that say what to change."""
    warnings = specs.parse_spec(body).warnings
    assert len(expected_fragments) == len(warnings)
    for fragment, warning in zip(expected_fragments, warnings, strict=True):
        assert fragment in warning


# ---------------------------------------------------------------- hash and schema


def test_spec_hash_ignores_spelling() -> None:
    """Key order, JSON versus YAML and defaults written out do not change the hash."""
    terse = specs.parse_spec(BASE.encode()).spec
    verbose_body = {
        "command": ["python", "train.py"],
        "kind": "job",
        "queue": "default",
        "workers": 1,
        "image": f"registry.example.com/train{DIGEST}",
        "name": "demo",
        "resources": {"gpus": 0},
    }
    verbose = specs.parse_spec(json.dumps(verbose_body).encode(), "application/json").spec
    assert specs.spec_hash(terse) == specs.spec_hash(verbose)


def test_spec_hash_changes_with_content() -> None:
    """Any change of meaning changes the hash; the format is sha256:<64 hex>."""
    one = specs.spec_hash(_parse())
    two = specs.spec_hash(_parse("resources: {gpus: 1}\n"))
    assert one != two
    assert one.startswith("sha256:")
    assert len(one) == len("sha256:") + 64


def test_json_schema_is_generated_from_the_models() -> None:
    """The schema speaks wire names, refuses unknown fields and lists the retry classes."""
    schema = specs.spec_json_schema()
    retry = schema["$defs"]["Retry"]
    actual = {
        "required": sorted(schema["required"]),
        "closed": schema["additionalProperties"],
        "has_camel_case": {"imagePullSecrets", "nprocPerNode", "shmSize"}
        <= set(schema["properties"]),
        "retry_fields": sorted(retry["properties"]),
        "retry_classes": retry["properties"]["when"]["items"]["enum"],
    }
    expected = {
        "required": ["command", "image", "name"],
        "closed": False,
        "has_camel_case": True,
        "retry_fields": ["backoff", "maxAttempts", "when"],
        "retry_classes": ["NodeFailure", "Evicted", "OOMKilled", "AppError", "Timeout"],
    }
    assert expected == actual


def test_committed_reference_matches_the_schema() -> None:
    """docs/tau-yaml.md is exactly what `python -m shared.specdoc` generates."""
    committed = (ROOT / "docs" / "tau-yaml.md").read_text(encoding="utf-8")
    assert specdoc.render_markdown() == committed


def test_reference_documents_every_field() -> None:
    """Every top-level field of the schema has a row in the generated reference."""
    text = specdoc.render_markdown()
    missing = [
        name for name in specs.spec_json_schema()["properties"] if f"| `{name}` |" not in text
    ]
    expected: list[str] = []
    assert expected == missing


# ---------------------------------------------------------------- the CRD


def _crd() -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "deploy" / "crds" / "taurun.yaml").read_text())
    assert isinstance(document, dict)
    return document


def test_crd_identity() -> None:
    """The CRD defines a namespaced taugrid.dev TauRun, short name tr, one stored version."""
    crd = _crd()
    version = crd["spec"]["versions"][0]
    actual = {
        "apiVersion": crd["apiVersion"],
        "kind": crd["kind"],
        "name": crd["metadata"]["name"],
        "group": crd["spec"]["group"],
        "scope": crd["spec"]["scope"],
        "names": {k: crd["spec"]["names"][k] for k in ("kind", "plural", "singular", "shortNames")},
        "versions": [(v["name"], v["served"], v["storage"]) for v in crd["spec"]["versions"]],
        "subresources": version["subresources"],
        "api_version_matches_spec": f"{crd['spec']['group']}/{version['name']}",
    }
    expected = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "name": "tauruns.taugrid.dev",
        "group": "taugrid.dev",
        "scope": "Namespaced",
        "names": {
            "kind": "TauRun",
            "plural": "tauruns",
            "singular": "taurun",
            "shortNames": ["tr"],
        },
        "versions": [("v1alpha1", True, True)],
        "subresources": {"status": {}},
        "api_version_matches_spec": specs.API_VERSION,
    }
    assert expected == actual


def test_crd_printer_columns() -> None:
    """kubectl get tr shows phase, queue, attempt and age."""
    columns = _crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    default_columns = [(c["name"], c["jsonPath"]) for c in columns if "priority" not in c]
    expected = [
        ("Phase", ".status.phase"),
        ("Queue", ".spec.queue"),
        ("Attempt", ".status.currentAttempt"),
        ("Age", ".metadata.creationTimestamp"),
    ]
    assert expected == default_columns


def _assert_structural(node: dict[str, Any], path: str) -> None:
    """Check the rules of a structural schema that a unit test can see: every node has a
    type unless it preserves unknown fields, and no $ref, anyOf at the top or additional
    properties beside properties."""
    assert "$ref" not in node, path
    if "type" not in node:
        assert node.get("x-kubernetes-preserve-unknown-fields") is True, path
    assert not ("properties" in node and "additionalProperties" in node), path
    for name, child in node.get("properties", {}).items():
        _assert_structural(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        _assert_structural(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        _assert_structural(node["additionalProperties"], f"{path}{{}}")


def test_crd_schema_is_structural() -> None:
    """The OpenAPI schema follows the structural rules the API server enforces."""
    schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    _assert_structural(schema, "")


def test_crd_spec_types_every_tau_yaml_field() -> None:
    """The CRD's spec lists exactly the tau.yaml top-level fields and keeps unknown ones
    (so the controller, not pruning, reports a typo by name)."""
    spec_schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    expected = (sorted(specs.spec_json_schema()["properties"]), True)
    actual = (
        sorted(spec_schema["properties"]),
        spec_schema["x-kubernetes-preserve-unknown-fields"],
    )
    assert expected == actual


def test_crd_status_fields() -> None:
    """The status holds phase, conditions, attempts, checkpoints, queue position, message,
    evidence and the current attempt."""
    status = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    expected = {
        "phase",
        "conditions",
        "attempts",
        "checkpoints",
        "queuePosition",
        "message",
        "evidence",
        "currentAttempt",
    }
    assert expected <= set(status["properties"])


# ---------------------------------------------------------------- hostile values (DESIGN §10)

NL = "\n"


def _spec_json(**fields: Any) -> bytes:
    base: dict[str, Any] = {
        "name": "demo",
        "image": f"registry.example.com/train{DIGEST}",
        "command": ["python", "train.py"],
    }
    return json.dumps({**base, **fields}).encode()


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        pytest.param(_spec_json(name="demo" + NL), "name", "not a valid run name",
                     id="a run name with a trailing newline"),
        pytest.param(_spec_json(namespace="team" + NL), "namespace", "not a valid name",
                     id="a namespace with a trailing newline"),
        pytest.param(_spec_json(image="repo/x:1" + NL), "image", "not an image reference",
                     id="an image with a trailing newline"),
        pytest.param(_spec_json(queue="q" + NL), "queue", "not a valid name",
                     id="a queue with a trailing newline"),
        pytest.param(_spec_json(priority="high" + NL), "priority", "not a valid name",
                     id="a priority with a trailing newline"),
        pytest.param(_spec_json(env={"A" + NL: "x"}), "env.A\n", "not a valid variable name",
                     id="an env name with a trailing newline"),
        pytest.param(_spec_json(labels={"team" + NL: "a"}), "labels.team\n",
                     "not a valid label key", id="a label key with a trailing newline"),
        pytest.param(_spec_json(labels={"team": "a" + NL}), "labels.team", "must be at most 63",
                     id="a label value with a trailing newline"),
        pytest.param(_spec_json(resources={"cpu": "4" + NL}), "resources.cpu",
                     "not a Kubernetes quantity", id="a cpu quantity with a trailing newline"),
        pytest.param(_spec_json(imagePullSecrets=["regcred" + NL]), "imagePullSecrets[0]",
                     "not a valid Kubernetes object name",
                     id="a pull secret with a trailing newline"),
        pytest.param(_spec_json(volumes=[{"claim": "d" + NL, "mountPath": "/d"}]),
                     "volumes[0].claim", "not a valid Kubernetes object name",
                     id="a claim with a trailing newline"),
        pytest.param(_spec_json(volumes=[{"claim": "d", "mountPath": "/d" + NL}]),
                     "volumes[0].mountPath", "without control characters",
                     id="a mount path with a trailing newline"),
        pytest.param(_spec_json(timeout="2h" + NL), "timeout", "not a duration",
                     id="a duration with a trailing newline"),
        pytest.param(_spec_json(name="x" * 100_000), "name", "not a valid run name",
                     id="a huge name is refused with a short message"),
        pytest.param(_spec_json(resources={"cpu": 10**19}), "resources.cpu", "at most 8Ei",
                     id="an integer cpu beyond int64"),
        pytest.param(_spec_json(resources={"memory": "9" * 60}), "resources.memory", "too large",
                     id="a sixty-digit memory quantity"),
        pytest.param(_spec_json(resources={"memory": "9" * 65}), "resources.memory",
                     "not a Kubernetes quantity", id="a quantity longer than any real one"),
        pytest.param(_spec_json(timeout="9" * 400 + "s"), "timeout", "not a duration",
                     id="a four-hundred-digit duration"),
        pytest.param(_spec_json(env={"NVIDIA_VISIBLE_DEVICES": "all"}),
                     "env.NVIDIA_VISIBLE_DEVICES", "device plugin",
                     id="NVIDIA_VISIBLE_DEVICES would bypass the GPU allocation"),
        pytest.param(_spec_json(env={"NVIDIA_DRIVER_CAPABILITIES": "all"}),
                     "env.NVIDIA_DRIVER_CAPABILITIES", "device plugin",
                     id="NVIDIA_DRIVER_CAPABILITIES is the device plugin's"),
        pytest.param(_spec_json(env={"NVIDIA_MIG_CONFIG_DEVICES": "all"}),
                     "env.NVIDIA_MIG_CONFIG_DEVICES", "device plugin",
                     id="NVIDIA_MIG_CONFIG_DEVICES is the device plugin's"),
        pytest.param(_spec_json(env={"NVIDIA_MIG_MONITOR_DEVICES": "all"}),
                     "env.NVIDIA_MIG_MONITOR_DEVICES", "device plugin",
                     id="NVIDIA_MIG_MONITOR_DEVICES is the device plugin's"),
        pytest.param(_spec_json(priority="taugrid-resume"), "priority", "controller's own",
                     id="the resume boost class is the controller's alone"),
        pytest.param(_spec_json(labels={"ray.io/node-type": "head"}), "labels.ray.io/node-type",
                     "reserved", id="a KubeRay label"),
        pytest.param(_spec_json(labels={"sidecar.istio.io/inject": "false"}),
                     "labels.sidecar.istio.io/inject", "reserved",
                     id="an Istio label that opts a pod out of the mesh"),
        pytest.param(_spec_json(labels={"jobset.sigs.x-k8s.io/jobset-name": "a"}),
                     "labels.jobset.sigs.x-k8s.io/jobset-name", "reserved",
                     id="a SIG project label under x-k8s.io"),
        pytest.param(_spec_json(labels={"app.kubernetes.io/name": "a"}),
                     "labels.app.kubernetes.io/name", "reserved",
                     id="a kubernetes.io label"),
        pytest.param(_spec_json(labels={"controller-uid": "a"}), "labels.controller-uid",
                     "reserved", id="the Job controller's controller-uid"),
        pytest.param(_spec_json(labels={"job-name": "a"}), "labels.job-name", "reserved",
                     id="the Job controller's job-name"),
        pytest.param(
            _spec_json(volumes=[{"claim": "d", "mountPath": "/var/run/secrets/kubernetes.io"}]),
            "volumes[0].mountPath", "reserved", id="a volume over the token directory"),
        pytest.param(
            _spec_json(volumes=[{"claim": "d", "mountPath": "/run/secrets"}]),
            "volumes[0].mountPath", "reserved", id="a volume over the token directory via /run"),
        pytest.param(
            _spec_json(volumes=[{"claim": "d", "mountPath": "/var/run//./secrets/x"}]),
            "volumes[0].mountPath", "reserved",
            id="a volume over the token directory spelt with // and /./"),
        pytest.param(
            _spec_json(volumes=[{"claim": "d", "mountPath": "/run/taugrid/checkpoint"}]),
            "volumes[0].mountPath", "reserved",
            id="a volume over the checkpoint file via /run"),
        pytest.param(
            _spec_json(checkpoint={"dir": "/var/run/secrets/ckpt", "volume": "c"}),
            "checkpoint.dir", "already in use",
            id="a checkpoint volume mounted over the token directory"),
    ],
)  # fmt: skip
def test_hostile_values_are_refused_naming_the_field(body: bytes, field: str, message: str) -> None:
    """What a hostile tenant (or a stray newline) sends is a 422-kind error naming the field,
    never a value the API server would refuse later (a 500, a poison run) or one that gives
    a pod more than a plain pod of its namespace (DESIGN.md section 10)."""
    with pytest.raises(specs.SpecError) as caught:
        specs.parse_spec(body, "application/json")
    error = caught.value
    assert (specs.SpecErrorKind.INVALID, field) == (error.kind, error.field)
    assert message in error.problems[0].message
    assert len(str(error)) < 1000


@pytest.mark.parametrize(
    ("body", "content_type", "message"),
    [
        pytest.param(b'{"name": "x", "workers": ' + b"1" * 5000 + b"}", "application/json",
                     "5000 digits", id="a five-thousand-digit JSON integer"),
        pytest.param(b'{"name": "x", "workers": 1e400}', "application/json", "infinity",
                     id="a JSON number that overflows to infinity"),
        pytest.param(b'{"name": "x", "workers": Infinity}', "application/json",
                     "Infinity is not a number", id="Infinity in JSON"),
        pytest.param(b"name: x\nworkers: " + b"1" * 5000 + b"\n", "application/yaml",
                     "5000 digits", id="a five-thousand-digit YAML integer"),
        pytest.param(b"name: x\nargs: [" + b"a, " * 20_000 + b"]\n", "application/yaml",
                     "more than 10000 nodes", id="twenty thousand YAML list items"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, "application/yaml", "nesting",
                     id="YAML nested a hundred thousand deep"),
    ],
)  # fmt: skip
def test_huge_numbers_and_deep_documents_are_malformed(
    body: bytes, content_type: str, message: str
) -> None:
    """Numbers and nesting no parser should build are refused while parsing (400-kind),
    never escaping as ValueError, OverflowError or RecursionError (a 500)."""
    with pytest.raises(specs.SpecError) as caught:
        specs.parse_spec(body, content_type)
    expected = specs.SpecErrorKind.MALFORMED
    assert expected == caught.value.kind
    assert message in str(caught.value)


def test_an_integer_too_long_for_text_is_refused_in_parsed_data() -> None:
    """Data that did not come through our parsers (a TauRun read back) may hold any integer;
    one longer than MAX_INT_DIGITS is refused, not turned into a 4,300-digit ValueError."""
    document = json.loads(_spec_json())
    with pytest.raises(specs.SpecError) as caught:
        specs.validate_spec({**document, "args": [10**5000]})
    expected = ("args[0]", True)
    assert expected == (caught.value.field, "quote it" in str(caught.value))


@pytest.mark.parametrize(
    ("fields", "env"),
    [
        pytest.param({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, {"CUDA_VISIBLE_DEVICES": "0"},
                     id="CUDA_VISIBLE_DEVICES narrows and grants nothing, so it stays allowed"),
        pytest.param({"env": {"NVIDIA_TF32_OVERRIDE": "0"}}, {"NVIDIA_TF32_OVERRIDE": "0"},
                     id="an NVIDIA_ library setting that grants no device stays allowed"),
    ],
)  # fmt: skip
def test_env_that_grants_no_device_is_accepted(fields: dict[str, Any], env: dict[str, str]) -> None:
    """Only the toolkit's device variables are refused, not every NVIDIA_ or CUDA_ name."""
    assert env == specs.parse_spec(_spec_json(**fields), "application/json").spec.env


def test_reserved_priority_classes_include_the_controllers_resume_class() -> None:
    """shared cannot import the controller's vocabulary; this pins the two to one name."""
    from controller import marks

    assert marks.RESUME_PRIORITY_CLASS in specs.RESERVED_PRIORITY_CLASSES


def test_schema_patterns_are_anchored_for_ecma_and_agree_with_the_validators() -> None:
    """Each pattern the JSON Schema publishes is `^(?:…)$` (ECMA-262 reads `$` as the end of
    the input), and a value it accepts the model accepts too."""
    schema = specs.spec_json_schema()
    found = _patterns(schema)
    assert found, "the schema publishes patterns"
    expected: list[str] = []
    assert expected == [p for p in found if not (p.startswith("^(?:") and p.endswith(")$"))]
    name = schema["properties"]["name"]
    assert (name["pattern"], name["maxLength"]) == (
        patterns.schema(specs._DNS1035_RE),
        specs.MAX_NAME_LENGTH,
    )


def _patterns(node: object) -> list[str]:
    if isinstance(node, dict):
        own = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        return own + [p for value in node.values() for p in _patterns(value)]
    if isinstance(node, list):
        return [p for value in node for p in _patterns(value)]
    return []


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(b"name: a\nnamespace: team-a\n", ["team-a"], id="a block line"),
        pytest.param(b'{"name": "a", "namespace": "team-a"}', ["team-a"], id="a JSON member"),
        pytest.param(b"namespace: 'team-a'  # ours\n", ["team-a"], id="quoted, with a comment"),
        pytest.param(b"name: a\n", [], id="none declared"),
        pytest.param(b"labels:\n  namespace: x\nnamespace: y\n", ["x", "y"],
                     id="a nested key of the same name is a candidate too, in order"),
        pytest.param(b"namespace: Team_A\n", [], id="a value that is no namespace name"),
        pytest.param(b"namespace: a\n" * 3 + b"".join(b"namespace: n%d\n" % i for i in range(9)),
                     ["a", "n0", "n1", "n2"], id="at most four distinct candidates"),
    ],
)  # fmt: skip
def test_declared_namespaces_are_found_without_parsing(body: bytes, expected: list[str]) -> None:
    """The namespaces a body may declare, from one scan of its bytes (M3: authorise first)."""
    assert expected == specs.declared_namespaces(body)


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        pytest.param("secretEnv: {TAU_TOKEN: {secret: s, key: k}}\n", "secretEnv.TAU_TOKEN",
                     "reserved", id="a TAU_ secretEnv name is reserved"),
        pytest.param("secretEnv: {NVIDIA_VISIBLE_DEVICES: {secret: s, key: k}}\n",
                     "secretEnv.NVIDIA_VISIBLE_DEVICES", "device plugin",
                     id="a device variable from a Secret is refused"),
        pytest.param("secretEnv: {1X: {secret: s, key: k}}\n", "secretEnv.1X",
                     "variable name", id="a secretEnv name that is not a variable is refused"),
        pytest.param("secretEnv: {X: {secret: Bad_Name, key: k}}\n", "secretEnv.X.secret",
                     "object name", id="a Secret name that is not one is refused"),
        pytest.param('secretEnv: {X: {secret: s, key: "k\\n"}}\n', "secretEnv.X.key",
                     "Secret key", id="a key with a trailing newline is refused (full match)"),
        pytest.param("secretEnv: {X: {secret: s}}\n", "secretEnv.X.key", "required",
                     id="a reference without its key is refused"),
        pytest.param("secretEnv: {X: {secret: s, key: k, value: v}}\n", "secretEnv.X.value",
                     "unknown field", id="a value beside the reference is refused"),
        pytest.param("env: {X: a}\nsecretEnv: {X: {secret: s, key: k}}\n", "secretEnv.X",
                     "in env too", id="a name in env and secretEnv both is refused"),
        pytest.param("kind: pytorch\nsecretEnv: {MASTER_ADDR: {secret: s, key: k}}\n",
                     "secretEnv.MASTER_ADDR", "rendezvous",
                     id="a pytorch rendezvous name from a Secret is refused"),
    ],
)  # fmt: skip
def test_secret_env_is_refused_naming_the_field(extra: str, field: str, words: str) -> None:
    """Issue 30: `secretEnv` names are validated as `env` names are, its Secret names and
    keys in full; a refusal names the field."""
    with pytest.raises(specs.SpecError) as caught:
        _parse(extra)
    problems = [(p.field, words in p.message) for p in caught.value.problems]
    assert (field, True) in problems, problems


def test_secret_env_keeps_only_names_on_the_wire() -> None:
    """The wire form (the TauRun's spec) carries the Secret's name and key, nothing more."""
    spec = _parse("secretEnv: {HF_TOKEN: {secret: hf, key: token}}\n")
    expected = {"HF_TOKEN": {"secret": "hf", "key": "token"}}
    assert expected == specs.spec_to_wire(spec)["secretEnv"]
