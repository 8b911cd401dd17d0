"""Render the tau.yaml reference (docs/tau-yaml.md) from the JSON Schema of the models.

The document is generated so that it cannot drift from what the controller accepts; a unit
test compares the committed file with `render_markdown()`. Regenerate with
`python -m shared.specdoc > docs/tau-yaml.md`.
"""

from __future__ import annotations

import json
from typing import Any

from shared import jsonsafe, yamlsafe
from shared import spec as specs

_INTRO = """\
# `tau.yaml` reference

<!-- Generated from shared/spec.py by `python -m shared.specdoc > docs/tau-yaml.md`.
     Do not edit by hand: a unit test compares this file with the generator. -->

A `tau.yaml` describes one run. Submit it with `tau run tau.yaml`, or
`curl --data-binary @tau.yaml -H 'Content-Type: application/yaml' $TAU_URL/v1/runs`.
The JSON Schema is served at `/v1/schema/run`.

```yaml
name: llama-ft            # required: lower case, at most 40 characters
image: registry.example.com/train@sha256:...   # required; pin by digest
command: [torchrun, train.py]                  # required: list, or a string for /bin/sh -c
kind: pytorch            # job (default), pytorch or ray
workers: 2
resources: {gpus: 8, cpu: "32", memory: 512Gi}
volumes: [{claim: datasets, mountPath: /data, readOnly: true}]
checkpoint: {dir: /ckpt/llama-ft, volume: checkpoints}
retry: {maxAttempts: 3, when: [NodeFailure, Evicted]}
timeout: 12h
```

## Rules

- Field names are camelCase. Unknown fields, duplicate keys and env names starting with
  `TAU_` are errors; every error names the field (`retry.when[0]`) and says what is allowed.
- YAML is read with YAML 1.2 core semantics: `on`, `yes`, `off` and `1:30` are strings, only
  `true`/`false` are booleans, `0o17` is octal, `010` is ten. Aliases are limited
  ({aliases} uses, {nodes} nodes once expanded, {depth} levels); tags other than the core ones
  (`!!str`, `!!int`, `!!float`, `!!bool`, `!!null`, `!!seq`, `!!map`) are refused.
- JSON is accepted too (`Content-Type: application/json`). The body must be UTF-8 and at most
  {max_bytes} bytes. In either, an integer has at most {int_digits} digits (quote a longer
  one), and `NaN`, `Infinity` and numbers beyond a double are refused.
- Names are matched in full: a value with a trailing newline (or space) is not a name.
  `name` is a DNS-1035 label of at most 40 characters; `namespace`, `queue` and `priority`
  are DNS-1123 labels; `volumes[].claim` and `imagePullSecrets` DNS-1123 subdomains.
- What would give a pod more than a plain pod of its namespace is refused (the platform's
  trust boundaries):
  - the NVIDIA container toolkit's device variables in `env` (`NVIDIA_VISIBLE_DEVICES`,
    `NVIDIA_DRIVER_CAPABILITIES`, `NVIDIA_MIG_CONFIG_DEVICES`, `NVIDIA_MIG_MONITOR_DEVICES`,
    `NVIDIA_IMEX_CHANNELS`): GPUs come from `resources.gpus` alone, and a container that asks
    for none is started with `NVIDIA_VISIBLE_DEVICES=void`, whatever its image sets.
    `CUDA_VISIBLE_DEVICES` (which only narrows) is allowed;
  - `priority: taugrid-resume`, the controller's own boost for resumed attempts, and any
    class outside the platform's allowlist when it has one;
  - labels in domains other controllers act on (`*.kubernetes.io`, `*.k8s.io`, `*.x-k8s.io`,
    `ray.io`, `*.istio.io`, `taugrid.dev`) and the unprefixed `controller-uid`, `job-name`
    and `pod-template-hash`;
  - a volume mounted at `/` or at or under the paths the pod needs as they are: `/dev/shm`, the
    checkpoint file's directory (`/var/run/taugrid/checkpoint`) and the ServiceAccount token
    directories (`/var/run/secrets`, `/run/secrets`).
- Before anything is created the API server checks the run's first objects; a spec it would
  refuse is refused at submission (422) with its message, never a run that cannot start.
  `POST /v1/runs?dryRun=true` runs the whole check and shows what would be created.
- Durations are strings with units: `90s`, `30m`, `2h`, `1h30m`, `2d`.
- Quantities are Kubernetes quantities: `500m`, `4`, `16Gi`.
- Whole numbers must be written as numbers (`workers: 2`, not `"2"`), booleans as
  `true`/`false`. In `command`, `args` and `env`, integers and booleans are taken as text;
  a decimal number must be quoted so it reaches the program exactly as written.
- An image that is not pinned by digest is accepted with a warning.

## What the run sees

Every pod gets `TAU_RUN`, `TAU_NAMESPACE`, `TAU_ATTEMPT` (1 for the first attempt),
`TAU_WORKERS`, `TAU_URL`, `TAU_TOKEN_FILE` (the pod's own token, which works only for this
run and attempt),
`TAU_CHECKPOINT_DIR` (when `checkpoint` is set), `TAU_CHECKPOINT_FILE` (a file holding the
latest reported checkpoint, kept current even when Kueue readmits the pod),
`TAU_RESUME_FROM` (the checkpoint a retried attempt starts from; empty otherwise) and
`TAU_FAILURE_REASON` (why the previous attempt failed), and `TAU_CA_FILE` (the CA to trust for
`TAU_URL`, when the controller serves HTTPS from a private CA). `kind: pytorch` also sets torchrun's
`PET_MASTER_ADDR`, `PET_MASTER_PORT`, `PET_NNODES`, `PET_NPROC_PER_NODE` and
`PET_NODE_RANK` (and the same names without `PET_`), so `command: [torchrun, train.py]`
needs no rendezvous flags. Every pod has a memory-backed `/dev/shm` of `shmSize`.

On SIGTERM (quarantine of a failing node, or preemption) save a checkpoint, report it with
`tau checkpoint --step N --path P`, and exit; at every start, read `TAU_CHECKPOINT_FILE`.

## Checked at submission

Before anything is created, the controller checks that what the file names exists in the
run's namespace (`tau validate tau.yaml` runs the same checks and creates nothing). What a
run could never start without is an error (422, naming the field; every problem is listed);
what may legitimately appear or change while the run waits is a warning in the answer:

- `queue`: an error when no LocalQueue of that name is in the namespace (Kueue would never
  admit the run); a warning when its ClusterQueue does not exist or is not active (the
  platform may fix that while the run waits).
- `volumes[i].claim`: an error when no PersistentVolumeClaim of that name is in the
  namespace (its pods could never be scheduled); a warning when the claim is not bound yet
  (a provisioner or a person may bind it later).
- `checkpoint.volume`: the same; and a warning for a claim that is not ReadWriteMany when
  the run has several workers (only rank 0 may write).
- `priority`: an error when no WorkloadPriorityClass of that name exists (Kueue would
  refuse the run).
- `imagePullSecrets`: never checked: the controller does not read Secrets.

A check the controller could not make (the API server failing, no right to read) is a
warning that it was not made, never a refusal. A TauRun applied with `kubectl` skips these
checks; a run whose pods then cannot start says why in its `message` (`tau status`).

You are told only what you may read yourself: the controller reads with its own rights, so
it first asks Kubernetes about yours. Without `get persistentvolumeclaims` in the namespace a
claim is "not checked: you may not get persistentvolumeclaims in team-a", the same words
whether it exists, is Pending or is missing, and never a refusal; the queue and its
ClusterQueue are told to whoever may `list tauruns` there (what `tau queues` needs); a
priority class is confirmed when the platform's allow-list names it (public configuration) or
you may `get workloadpriorityclasses.kueue.x-k8s.io`, else not checked. Likewise the names
your run's objects take (`<run>-checkpoint`, `<run>-a1`): a name somebody else's object holds
is a 409 `NameTaken` only if you may `get` that kind there; otherwise one warning that the
names were not checked, and a run whose name turns out taken ends Failed `NameTaken`.
"""


def render_markdown(schema: dict[str, Any] | None = None) -> str:
    """Return the Markdown reference for `schema` (default: the tau.yaml JSON Schema)."""
    schema = specs.spec_json_schema() if schema is None else schema
    defs: dict[str, Any] = schema.get("$defs", {})
    intro = (
        _INTRO.replace("{aliases}", str(yamlsafe.MAX_ALIASES))
        .replace("{nodes}", str(yamlsafe.MAX_NODES))
        .replace("{depth}", str(yamlsafe.MAX_DEPTH))
        .replace("{max_bytes}", str(specs.MAX_SPEC_BYTES))
        .replace("{int_digits}", str(jsonsafe.MAX_INT_DIGITS))
    )
    sections = [intro]
    order: list[str] = []
    sections.append(_section("Top level", schema, defs, order))
    done: set[str] = set()
    while order:
        name = order.pop(0)
        if name in done:
            continue
        done.add(name)
        sections.append(_section(f"`{name}`", defs[name], defs, order))
    return "\n".join(sections)


def _section(title: str, node: dict[str, Any], defs: dict[str, Any], order: list[str]) -> str:
    lines = [f"## {title}", ""]
    description = node.get("description")
    if description:
        lines += [_one_line(description), ""]
    lines += ["| field | type | default | description |", "|---|---|---|---|"]
    required = set(node.get("required", []))
    for name, prop in node.get("properties", {}).items():
        default = "required" if name in required else _default(prop)
        lines.append(
            f"| `{name}` | {_type(prop, defs, order)} | {default} "
            f"| {_escape(_one_line(prop.get('description', '')))} |"
        )
    lines.append("")
    return "\n".join(lines)


def _type(prop: dict[str, Any], defs: dict[str, Any], order: list[str]) -> str:
    if "$ref" in prop:
        name = str(prop["$ref"]).rsplit("/", 1)[-1]
        target = defs.get(name, {})
        if "enum" in target:
            return _enum(target["enum"])
        order.append(name)
        return f"[`{name}`](#{name.lower()})"
    if "anyOf" in prop:
        parts = [p for p in prop["anyOf"] if p.get("type") != "null"]
        if {p.get("type") for p in parts} == {"string", "integer", "boolean"}:
            return "text"
        return " or ".join(_type(p, defs, order) for p in parts)
    if "enum" in prop:
        return _enum(prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    kind = prop.get("type")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}), defs, order)}"
    if kind == "object":
        values = prop.get("additionalProperties")
        if isinstance(values, dict):
            return f"map of string to {_type(values, defs, order)}"
        return "mapping"
    words = {"integer": "integer", "string": "string", "boolean": "boolean", "number": "number"}
    text = words.get(str(kind), "any")
    bounds = []
    if "minimum" in prop:
        bounds.append(f"≥ {prop['minimum']}")
    if "maximum" in prop:
        bounds.append(f"≤ {prop['maximum']}")
    return f"{text} ({', '.join(bounds)})" if bounds else text


def _enum(values: list[Any]) -> str:
    return "one of " + ", ".join(f"`{v}`" for v in values)


def _default(prop: dict[str, Any]) -> str:
    if "default" not in prop:
        return ""
    value = prop["default"]
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if v is not None}
    if value is None:
        return ""
    return f"`{json.dumps(value)}`" if not isinstance(value, str) else f"`{value}`"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def main() -> None:
    """Print the reference to stdout."""
    print(render_markdown(), end="")


if __name__ == "__main__":
    main()
