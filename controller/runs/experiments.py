"""Experiments: the runs that share `experiment.name`, listed and compared.

`GET /v1/experiments?namespace=NS` lists the experiments of a namespace (name, projects,
tags, runs by phase); `GET /v1/experiments/compare?namespace=NS&name=E` (or `&run=A&run=B`)
gives each run's final metrics side by side, and with `&metric=loss` each run's series of
that metric, to overlay (`tau results --experiment E`, the web page's chart). Both need
`list tauruns` in the namespace: they read exactly what listing the runs would show.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from controller import errors, serving
from controller.runs import context, results, schemas

MAX_COMPARED = 50
"""Runs one comparison returns (the newest); a chart of more is unreadable anyway."""


def _experiment(item: dict[str, Any]) -> dict[str, Any]:
    value = (item.get("spec") or {}).get("experiment")
    return value if isinstance(value, dict) else {}


async def _runs(request: web.Request, namespace: str) -> list[dict[str, Any]]:
    """The namespace's runs, as `list tauruns` there allows."""
    identity = await serving.identity(request)
    await context.allow(request, identity, "list", namespace)
    # A whole namespace's runs read per call: the same per-identity slots as a run list.
    with context.expensive_read(request, identity):
        return await context.context_of(request).store.list_runs(namespace)


@serving.operation(
    "listExperiments", tag="runs", query=schemas.ExperimentsQuery,
    replies={200: serving.Reply("The namespace's experiments.", schemas.ExperimentList)},
)  # fmt: skip
async def list_experiments(request: web.Request) -> web.StreamResponse:
    """The namespace's experiments: name, projects, tags, and its runs by phase."""
    namespace = serving.query_of(request, schemas.ExperimentsQuery).namespace
    items = await _runs(request, namespace)
    found: dict[str, dict[str, Any]] = {}
    for item in items:
        exp = _experiment(item)
        name = exp.get("name")
        if not isinstance(name, str) or not name:
            continue
        entry = found.setdefault(
            name, {"name": name, "projects": [], "tags": [], "runs": 0, "phases": {},
                   "latest": None},
        )  # fmt: skip
        run = context.run_json(item, with_spec=False)
        entry["runs"] += 1
        entry["phases"][run["phase"]] = entry["phases"].get(run["phase"], 0) + 1
        project = exp.get("project")
        if isinstance(project, str) and project and project not in entry["projects"]:
            entry["projects"].append(project)
        for tag in exp.get("tags") or []:
            if isinstance(tag, str) and tag not in entry["tags"]:
                entry["tags"].append(tag)
        created = run["createdAt"] or ""
        entry["latest"] = max(entry["latest"] or "", created) or None
    out = sorted(found.values(), key=lambda e: (e["latest"] or "", e["name"]), reverse=True)
    return web.json_response({"namespace": namespace, "items": out})


@serving.operation(
    "compareRuns", tag="runs", query=schemas.CompareQuery,
    replies={200: serving.Reply("The runs side by side.", schemas.Comparison)}, errors=(404,),
)  # fmt: skip
async def compare(request: web.Request) -> web.StreamResponse:
    """The runs of an experiment (`name`), or the runs named (`run`, repeated), side by
    side: each run's final metrics, and with `metric` its series of that metric."""
    query = serving.query_of(request, schemas.CompareQuery)
    name, wanted, metric = query.name, query.run, query.metric
    if (name is None) == (not wanted):
        msg = "give an experiment (name=E) or runs (run=A&run=B), not both and not neither"
        raise errors.InvalidParameter(msg, field="name")
    items = await _runs(request, query.namespace)
    if name is not None:
        chosen = [i for i in items if _experiment(i).get("name") == name]
    else:
        by_name = {(i.get("metadata") or {}).get("name"): i for i in items}
        missing = [r for r in wanted if r not in by_name]
        if missing:
            msg = f"no run named {missing[0]!r} in namespace {query.namespace}"
            raise errors.NotFound(msg, field="run")
        chosen = [by_name[r] for r in wanted]
    chosen.sort(key=lambda i: (i.get("metadata") or {}).get("creationTimestamp") or "")
    chosen = chosen[-MAX_COMPARED:]
    runs = []
    names: list[str] = []
    for item in chosen:
        run = context.run_json(item, with_spec=False)
        kept = context.results_of(item)
        entry: dict[str, Any] = {
            k: run[k] for k in ("name", "phase", "attempt", "createdAt", "experiment")
        }
        entry["final"] = results.finals(kept)
        entry["summary"] = kept.summary if kept is not None else ""
        for series in kept.metrics if kept is not None else ():
            if series.name not in names:
                names.append(series.name)
        if metric is not None:
            series_wire = results.wire(kept, metric=metric)["metrics"]
            entry["points"] = series_wire[0]["points"] if series_wire else []
        runs.append(entry)
    return web.json_response(
        {"namespace": query.namespace, "experiment": name, "metric": metric, "metrics": names,
         "runs": runs}
    )  # fmt: skip
