"""`tau run` and the namespace: what a command line submits, and where."""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.unit.client import stub

SPEC = "name: mnist\nimage: python:3.12\ncommand: [python, t.py]\nresources: {gpus: 1, cpu: '2'}\n"
SPEC_IN_B = SPEC + "namespace: team-b\n"
SPEC_JSON = json.dumps({"name": "mnist", "image": "python:3.12", "command": ["python"]})


@pytest.fixture
def controller() -> Iterator[stub.Controller]:
    """A loopback controller that records what the client sends."""
    server = stub.Controller()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def home(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """A clean environment: no TAU_* variables, an empty config dir, files in tmp_path."""
    for name in ("TAU_URL", "TAU_TOKEN", "TAU_TOKEN_FILE", "TAU_NAMESPACE", "TAU_CA_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tau.yaml").write_text(SPEC)
    (tmp_path / "b.yaml").write_text(SPEC_IN_B)
    (tmp_path / "tau.json").write_text(SPEC_JSON)
    return tmp_path


def _config(home: pathlib.Path, **values: str) -> None:
    path = home / "config" / "tau" / "config"
    path.parent.mkdir(parents=True)
    path.write_text("[tau]\n" + "".join(f"{k} = {v}\n" for k, v in values.items()))


def _submitted(controller: stub.Controller) -> tuple[str | None, dict[str, Any]]:
    """The namespace asked for and the spec of the last submission (not a dry run)."""
    last = [s for s in controller.posts() if s.query.get("dryRun") != "true"][-1]
    spec = json.loads(last.body) if "json" in last.content_type else {"yaml": last.body.decode()}
    return last.query.get("namespace"), spec


# ---------------------------------------------------------------- what gets submitted
@pytest.mark.parametrize(
    ("argv", "env", "namespace", "fields"),
    [
        pytest.param(["run", "tau.yaml", "-n", "team-a", "--json"], {}, "team-a", {},
                     id="flags after the file are read"),
        pytest.param(["run", "-n", "team-a", "tau.yaml"], {}, "team-a", {},
                     id="flags before the file are read"),
        pytest.param(["-n", "team-a", "run", "tau.yaml"], {}, "team-a", {},
                     id="-n before the verb is read"),
        pytest.param(["run", "tau.yaml", "--name", "lr-1"], {}, None, {"name": "lr-1"},
                     id="--name replaces the file's name"),
        pytest.param(["run", "tau.yaml", "--queue", "fast"], {}, None, {"queue": "fast"},
                     id="--queue replaces the file's queue"),
        pytest.param(["run", "tau.yaml", "--gpus", "8"], {}, None,
                     {"resources": {"gpus": 8, "cpu": "2"}},
                     id="--gpus replaces the file's GPUs and keeps its other resources"),
        pytest.param(["run", "tau.yaml", "--workers", "4", "--kind", "pytorch"], {}, None,
                     {"workers": 4, "kind": "pytorch"},
                     id="--workers and --kind replace the file's"),
        pytest.param(["run", "tau.yaml", "--priority", "high"], {}, None, {"priority": "high"},
                     id="--priority replaces the file's priority"),
        pytest.param(["run", "tau.json", "--name", "j-1"], {}, None,
                     {"name": "j-1", "command": ["python"]},
                     id="a JSON file is changed by tau itself"),
        pytest.param(["run", "--image", "img", "--", "python", "t.py", "--lr", "1"], {}, "default",
                     {"image": "img", "command": ["python", "t.py", "--lr", "1"]},
                     id="the command after -- keeps its own flags"),
        pytest.param(["run", "--image", "img", "python", "t.py"], {}, "default",
                     {"image": "img", "command": ["python", "t.py"]},
                     id="with --image the words after the options are the command"),
        pytest.param(["run", "--image", "img", "--gpus", "2", "--name", "x", "--", "nvidia-smi"],
                     {}, "default", {"name": "x", "resources": {"gpus": 2}, "workers": 1,
                                "kind": "job"},
                     id="an inline run takes its name, GPUs and defaults from the flags"),
        pytest.param(["run", "b.yaml"], {"TAU_NAMESPACE": "team-c"}, None, {},
                     id="the spec's namespace beats TAU_NAMESPACE (none is sent)"),
        pytest.param(["run", "b.yaml", "-n", "team-a"], {}, "team-a", {},
                     id="-n beats the spec's namespace"),
        pytest.param(["run", "tau.yaml"], {"TAU_NAMESPACE": "team-c"}, "team-c", {},
                     id="TAU_NAMESPACE is used when the spec names none"),
        pytest.param(["run", "--image", "i", "--", "c"], {"TAU_NAMESPACE": "team-c"}, "team-c",
                     {}, id="TAU_NAMESPACE is used for an inline run"),
        pytest.param(["run", "tau.yaml"], {}, None, {}, id="nothing anywhere: none is sent"),
    ],
)  # fmt: skip
def test_tau_run_submits_what_the_line_says(  # noqa: PLR0917 - parametrized
    argv: list[str], env: dict[str, str], namespace: str | None, fields: dict[str, Any],
    controller: stub.Controller, home: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Each line submits one run: the namespace sent is the one -n, the spec or the
    environment gives (in that order), and the flags' fields replace the file's."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code = stub.tau_client().main(["--url", controller.url, *argv])
    sent_ns, spec = _submitted(controller)
    actual = (code, sent_ns, {k: spec.get(k) for k in fields})
    assert (0, namespace, fields) == actual


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["run", "--gpus", "1", "--", "python", "t.py"], "add --image IMAGE",
                     id="a forgotten --image is named"),
        pytest.param(["run", "tau.yaml", "--image", "x"], "not both",
                     id="a file and --image are two runs at once"),
        pytest.param(["run", "tau.yaml", "--", "python"], "goes with --image",
                     id="a file and a command after -- are refused"),
        pytest.param(["run", "tau.yaml", "other.yaml"], "takes one tau.yaml",
                     id="two files are refused"),
        pytest.param(["run", "--image", "img"], "--image needs a command after `--`",
                     id="an image without a command says where the command goes"),
        pytest.param(["run"], "give a tau.yaml, or --image", id="nothing at all asks for either"),
        pytest.param(["run", "python"], "tau run --image IMAGE -- python",
                     id="a command given as the file suggests --image"),
        pytest.param(["run", "tau.yaml", "--kind", "mpi"], "invalid choice",
                     id="an unknown kind is refused by name"),
    ],
)  # fmt: skip
def test_tau_run_refuses_a_line_it_cannot_read_saying_why(
    argv: list[str], message: str, controller: stub.Controller, home: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Usage errors are exit 2 with a message that names what is missing; nothing is sent."""
    try:
        code = stub.tau_client().main(["--url", controller.url, *argv])
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    err = capsys.readouterr().err
    expected: tuple[Any, ...] = (2, True, [])
    assert expected == (code, message in err, controller.posts())


def test_a_yaml_file_with_overrides_is_read_through_the_dry_run(
    controller: stub.Controller, home: pathlib.Path
) -> None:
    """The standard library reads no YAML: the controller's dry run returns the file as JSON,
    tau changes the fields and submits JSON; the first call created nothing."""
    code = stub.tau_client().main(["--url", controller.url, "run", "tau.yaml", "--name", "n2"])
    kinds = [(s.query.get("dryRun"), s.content_type) for s in controller.posts()]
    expected = (0, [("true", "application/yaml"), (None, "application/json")])
    assert expected == (code, kinds)


@pytest.mark.parametrize(
    ("argv", "pattern"),
    [
        pytest.param(["run", "tau.yaml", "--generate-name"], r"mnist-[0-9a-f]{5}",
                     id="--generate-name adds a suffix to the file's name"),
        pytest.param(["run", "tau.yaml", "--generate-name", "--name", "lr"], r"lr-[0-9a-f]{5}",
                     id="--generate-name adds it to --name"),
        pytest.param(["run", "--image", "i", "--", "c"], r"run-[0-9a-f]{5}",
                     id="an inline run without a name gets a generated one"),
        pytest.param(["run", "--image", "i", "--name", "fixed", "--", "c"], r"fixed",
                     id="an inline run with --name keeps it"),
    ],
)  # fmt: skip
def test_generated_names_let_a_rerun_go_unedited(
    argv: list[str], pattern: str, controller: stub.Controller, home: pathlib.Path
) -> None:
    """A run's name must be unique: --generate-name makes a new one each time."""
    stub.tau_client().main(["--url", controller.url, *argv])
    _, spec = _submitted(controller)
    assert re.fullmatch(pattern, spec["name"])


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        pytest.param("mnist", "mnist-12345", id="a short name keeps all of itself"),
        pytest.param("a" * 33 + "-bcdef", "a" * 33 + "-12345",
                     id="a long name is cut to fit 40, without a dangling dash"),
        pytest.param("b" * 40, "b" * 34 + "-12345", id="a name of 40 is cut to 34"),
    ],
)  # fmt: skip
def test_a_generated_name_stays_a_valid_run_name(base: str, expected: str) -> None:
    """A generated name is at most 40 characters (shared/spec.py MAX_NAME_LENGTH)."""
    assert expected == stub.tau_client().generated_name(base, "12345")


def test_the_follow_up_line_names_the_namespace(
    controller: stub.Controller, home: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The printed commands find the run: they carry the namespace it went to."""
    stub.tau_client().main(["--url", controller.url, "run", "b.yaml"])
    out = capsys.readouterr().out
    assert "follow it with: tau status mnist -n team-b  |  tau logs -f mnist -n team-b\n" in out


# ---------------------------------------------------------------- one namespace order
@pytest.mark.parametrize(
    ("flag", "spec", "env", "config", "expected"),
    [
        pytest.param("a", "b", "c", "d", ("a", "-n"), id="-n comes first"),
        pytest.param(None, "b", "c", "d", ("b", "spec"), id="then the spec's namespace"),
        pytest.param(None, None, "c", "d", ("c", "TAU_NAMESPACE"), id="then TAU_NAMESPACE"),
        pytest.param(None, None, "", "d", ("d", "config"), id="then the config file"),
        pytest.param(None, None, None, None, ("default", "default"), id="then default"),
    ],
)  # fmt: skip
def test_every_verb_resolves_the_namespace_in_one_order(
    flag: str | None, spec: str | None, env: str | None, config: str | None,
    expected: tuple[str, str],
) -> None:  # fmt: skip
    """One order for every verb, so `tau status` reads where `tau run` submitted."""
    assert expected == stub.tau_client().resolve_namespace(flag, spec, env, config)


@pytest.mark.parametrize(
    ("argv", "env", "config", "path"),
    [
        pytest.param(["status", "x"], {}, {}, "/v1/runs/default/x", id="status: default"),
        pytest.param(["status", "x"], {"TAU_NAMESPACE": "e"}, {"namespace": "c"},
                     "/v1/runs/e/x", id="status: TAU_NAMESPACE beats the config"),
        pytest.param(["status", "x"], {}, {"namespace": "c"}, "/v1/runs/c/x",
                     id="status: the config's namespace beats default"),
        pytest.param(["status", "x", "-n", "f"], {"TAU_NAMESPACE": "e"}, {}, "/v1/runs/f/x",
                     id="status: -n beats everything"),
        pytest.param(["cancel", "x"], {}, {"namespace": "c"}, "/v1/runs/c/x",
                     id="cancel: the config's namespace"),
    ],
)  # fmt: skip
def test_other_verbs_use_the_same_order(  # noqa: PLR0917 - parametrized
    argv: list[str], env: dict[str, str], config: dict[str, str], path: str,
    controller: stub.Controller, home: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """status, cancel and the rest ask in the namespace the one order gives."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if config:
        _config(home, **config)
    controller.routes[("GET", path)] = (200, stub.run_json("x", "n"), {})
    controller.routes[("DELETE", path)] = (200, stub.run_json("x", "n"), {})
    stub.tau_client().main(["--url", controller.url, *argv])
    assert path == controller.seen[-1].path


def test_options_before_the_verb_are_not_undone_by_the_verb(
    controller: stub.Controller, home: pathlib.Path
) -> None:
    """`tau --url U --token T status X`: the verb's own copies of the options default to
    nothing, so the values given before it stay."""
    controller.routes[("GET", "/v1/runs/default/x")] = (200, stub.run_json("x", "default"), {})
    code = stub.tau_client().main(["--url", controller.url, "--token", "t", "status", "x"])
    expected = (0, "Bearer t")
    assert expected == (code, controller.seen[-1].authorization)


def test_a_rerun_names_the_namespace_to_follow_it_in(
    controller: stub.Controller, home: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tau rerun` prints the same follow-up line, with the new run's namespace."""
    answer = {**stub.run_json("x-r1", "team-a"), "warnings": []}
    controller.routes[("POST", "/v1/runs/team-a/x/rerun")] = (201, answer, {})
    stub.tau_client().main(["--url", controller.url, "-n", "team-a", "rerun", "x"])
    assert "tau status x-r1 -n team-a  |  tau logs -f x-r1 -n team-a\n" in capsys.readouterr().out


def test_a_taken_name_says_how_to_submit_again(
    controller: stub.Controller, home: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The 409 for a name in use ends with the command that submits the file again."""
    taken = {"error": {"code": "AlreadyExists", "message": "a run named 'mnist' exists",
                       "field": "name"}}  # fmt: skip
    controller.routes[("POST", "/v1/runs")] = (409, taken, {})
    code = stub.tau_client().main(["--url", controller.url, "run", "tau.yaml"])
    expected = (6, True)
    assert expected == (code, "tau run tau.yaml --generate-name" in capsys.readouterr().err)


def test_a_line_without_its_image_is_named_before_a_missing_url(
    home: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A newcomer with no TAU_URL yet still learns first what the line itself lacks."""
    code = stub.tau_client().main(["run", "--gpus", "1", "--", "python", "t.py"])
    expected = (2, True)
    assert expected == (code, "add --image IMAGE" in capsys.readouterr().err)
