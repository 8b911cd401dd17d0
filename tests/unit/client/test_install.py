"""How `tau` gets to people: the console script, its version, its help and Python 3.8."""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tomllib

import pytest

from tests.unit.client import stub

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_the_console_script_is_the_served_file() -> None:
    """`pip install` and the checkout's .venv/bin get a `tau` that runs the very file the
    controller serves at /tau (no second copy to drift)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    module_name, _, attr = project["scripts"]["tau"].partition(":")
    module = importlib.import_module(module_name)
    expected = (stub.TAU, True)
    assert expected == (
        pathlib.Path(module.__file__ or "").resolve(),
        callable(getattr(module, attr)),
    )


def test_the_client_version_is_the_projects() -> None:
    """`tau --version` says the release it came with."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == stub.tau_client().__version__


def _help(*argv: str) -> str:
    done = subprocess.run(
        [sys.executable, str(stub.TAU), *argv], capture_output=True, text=True, check=True,
        env={"PATH": os.environ["PATH"], "XDG_CONFIG_HOME": "/nonexistent"},
    )  # fmt: skip
    return done.stdout


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        pytest.param(["--help"], "TAU_URL", id="tau --help says how to set the controller's URL"),
        pytest.param(["--help"], "TAU_TOKEN", id="tau --help says how to set the token"),
        pytest.param(["--help"], "tau login", id="tau --help names tau login"),
        pytest.param(["--help"], "--duration", id="tau --help says tokens expire"),
        pytest.param(["--help"], "Exit codes", id="tau --help lists the exit codes"),
        pytest.param(["--help"], "tau run --gpus 4 --image IMG -- python t.py",
                     id="tau --help shows examples"),
        pytest.param(["--help"], "quarantine", id="tau --help lists the on-call verbs"),
        pytest.param(["--version"], "tau 0.1.0", id="tau --version prints the version"),
        pytest.param(["run", "--help"], "replace the file's values",
                     id="tau run --help says flags replace the file's values"),
        pytest.param(["list", "--help"], "Succeeded", id="tau list --help lists the phases"),
        pytest.param(["logs", "--help"], "--all-workers", id="tau logs --help names --all-workers"),
    ],
)  # fmt: skip
def test_the_help_says_how_to_use_it(argv: list[str], needle: str) -> None:
    """What a newcomer needs is in --help, not only in the docs."""
    assert needle in _help(*argv)


def _python38() -> str | None:
    """A Python 3.8 interpreter, where this machine has one (pyenv's or on PATH)."""
    candidates = [shutil.which("python3.8") or ""]
    candidates += sorted(
        str(p) for p in pathlib.Path.home().glob(".pyenv/versions/3.8*/bin/python3.8")
    )
    for candidate in candidates:
        if not candidate:
            continue
        done = subprocess.run([candidate, "--version"], capture_output=True, check=False)
        if done.returncode == 0:
            return candidate
    return None


PARSE = """
import importlib.machinery, json, sys, types
loader = importlib.machinery.SourceFileLoader("tau_client", sys.argv[1])
tau = types.ModuleType(loader.name)
loader.exec_module(tau)
out = []
for argv in json.loads(sys.argv[2]):
    a = tau.parse(argv)
    out.append([a.verb, a.file, a.command, a.namespace, a.json, a.name, a.gpus])
print(json.dumps(out))
"""
LINES = [
    ["run", "tau.yaml", "-n", "team-a", "--json"],
    ["-n", "x", "run", "tau.yaml", "--gpus", "2", "--name", "n"],
    ["run", "--image", "i", "--", "python", "-u", "t.py", "--lr", "1"],
    ["run", "--image", "i", "python", "t.py"],
]


def test_the_client_parses_the_same_on_python_3_8() -> None:
    """The served file must run on the oldest Python a researcher's machine may have: under
    3.8 it prints its help and reads `tau run` lines exactly as this interpreter does."""
    python38 = _python38()
    if python38 is None:
        pytest.skip("no Python 3.8 on this machine")
    results = []
    for python in (python38, sys.executable):
        done = subprocess.run(
            [python, "-c", PARSE, str(stub.TAU), json.dumps(LINES)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        results.append(json.loads(done.stdout))
    helped = subprocess.run([python38, str(stub.TAU), "--help"], capture_output=True, text=True,
                            check=False)  # fmt: skip
    expected = (results[1], 0)
    assert expected == (results[0], helped.returncode)


def _documented_lines() -> list[str]:
    """The `tau …` lines of docs/researcher.md's command reference (its sh blocks under
    "Get the client" and "Submit and follow"), comments cut off."""
    text = (ROOT / "docs" / "researcher.md").read_text()
    section = text[text.index("## Get the client") : text.index("## What the phases mean")]
    lines = []
    for block in section.split("```sh\n")[1:]:
        for line in block.split("```", 1)[0].splitlines():
            command = line.split("  #", 1)[0].strip()
            if command.startswith("tau ") and "--help" not in command:
                lines.append(command)
    return lines


@pytest.mark.parametrize("line", _documented_lines())
def test_every_documented_command_parses(line: str) -> None:
    """The docs' commands are ones this tau reads (argparse exits 2 on anything else)."""
    argv = [a.replace('"$TAU_URL"', "https://c") for a in shlex.split(line)[1:]]
    args = stub.tau_client().parse(argv)
    assert args.verb in argv


SMOKE = [
    ["run", "tau.yaml", "-n", "team-a"],
    ["run", "tau.yaml", "--gpus", "2", "--name", "n2"],
    ["run", "--image", "i", "--name", "x", "--", "python", "-u", "t.py"],
    ["status", "r"],
    ["logs", "r", "--all-workers", "--since", "5m"],
    ["results", "r"],
    ["nodes"],
    ["--token", "-", "fleet"],
    ["login", "--no-check", "--token", "-"],
]


def test_the_verbs_answer_the_same_on_python_3_8(tmp_path: pathlib.Path) -> None:
    """Each verb, run by Python 3.8 against a stand-in controller, prints what this
    interpreter's run prints and exits the same (so no 3.9+ call hides in a verb)."""
    python38 = _python38()
    if python38 is None:
        pytest.skip("no Python 3.8 on this machine")
    (tmp_path / "tau.yaml").write_text("name: mnist\nimage: i\ncommand: [c]\n")
    server = stub.Controller()
    run = stub.run_json("r", "default", attempt=1, spec={"workers": 2})
    server.routes[("GET", "/v1/runs/default/r")] = (200, run, {})
    server.routes[("GET", "/v1/runs/default/r/logs")] = (200, b"a\nb\n", {"Content-Type": "t/p"})
    server.routes[("GET", "/v1/runs/default/r/results")] = (
        200, {"name": "r", "metrics": [], "artifacts": [{"uri": "s3://b/m"}], "summary": "s"}, {},
    )  # fmt: skip
    server.routes[("GET", "/v1/nodes")] = (200, {"items": []}, {})
    server.routes[("GET", "/v1/fleet")] = (200, {"breaker": {}, "states": {}}, {})
    answers = []
    try:
        for number, python in enumerate((python38, sys.executable)):
            config = tmp_path / f"config-{number}"
            for argv in SMOKE:
                done = subprocess.run(
                    [python, str(stub.TAU), *argv], capture_output=True, text=True, check=False,
                    cwd=tmp_path, input="tok\n",
                    env={"PATH": os.environ["PATH"], "TAU_URL": server.url,
                         "XDG_CONFIG_HOME": str(config)},
                )  # fmt: skip
                out = done.stdout.replace(str(config), "CONFIG")
                answers.append((argv, done.returncode, out, done.stderr.replace(python, "PY")))
    finally:
        server.close()
    half = len(SMOKE)
    expected = (answers[half:], [0] * half)
    assert expected == (answers[:half], [a[1] for a in answers[half:]])
