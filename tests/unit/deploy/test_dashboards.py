"""The Grafana dashboard and the alert rules: they parse, and they query only what exists.

Every metric name in a PromQL expression must be one we export (read from the controller's
registry and from the agent's rendered `/metrics`), a dcgm-exporter `DCGM_FI_*` family the
agent renders with dcgm-exporter's name, a Kueue family checked against Kueue's source, or
`up`. Label names and the values of enum-like labels are checked too, because a typo there
gives an empty panel or an alert that never fires, exactly like a wrong metric name.

There is no promtool here, so `PromQL` below is a small tokenizer that finds selectors,
function calls and grouping labels; it is tested on its own first.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import pathlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

import prometheus_client as prom
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent import latching, readings, snapshots, verdicts
from agent import metrics as agent_metrics
from controller import metrics as controller_metrics
from controller.admission import views
from controller.fleet import actions, state
from controller.runs import records
from shared import health, xid
from shared import spec as specs

REPO = pathlib.Path(__file__).resolve().parents[3]
FILES = REPO / "deploy" / "helm" / "taugrid" / "files"
DASHBOARD = FILES / "dashboard.json"
ALERTS = FILES / "alerts.yaml"
ONCALL = REPO / "docs" / "oncall.md"

T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
UUID = "GPU-11111111-2222-3333-4444-555555555555"

SCRAPE_LABELS = frozenset(
    {"instance", "job", "node", "namespace", "pod", "container", "service", "endpoint"}
)
"""Labels Prometheus or the chart's scrape configuration add to every series (the agent
exports no `node` label: the scrape adds it from the pod's node name)."""

EXPECTED_SOON: dict[str, frozenset[str]] = {
    "taugrid_admission_decisions_total": frozenset({"state"}),
    "taugrid_admission_check_active": frozenset(),
    "taugrid_checkpoints_reported_total": frozenset(),
    "taugrid_run_resumes_total": frozenset({"failure_class"}),
}
"""Controller families announced while the dashboard was written; each is accepted only until
controller/metrics.py registers it, and must then be exported under exactly this name."""

_KUEUE_HISTOGRAM_LABELS = frozenset({"cluster_queue", "priority_class", "replica_role"})
KUEUE_FAMILIES: dict[str, tuple[str, frozenset[str]]] = {
    "kueue_pending_workloads": ("gauge", frozenset({"cluster_queue", "status", "replica_role"})),
    "kueue_local_queue_pending_workloads": (
        "gauge",
        frozenset({"name", "namespace", "status", "replica_role"}),
    ),
    "kueue_admitted_active_workloads": ("gauge", frozenset({"cluster_queue", "replica_role"})),
    "kueue_reserving_active_workloads": ("gauge", frozenset({"cluster_queue", "replica_role"})),
    "kueue_cluster_queue_status": ("gauge", frozenset({"cluster_queue", "status", "replica_role"})),
    "kueue_admitted_workloads_total": ("counter", _KUEUE_HISTOGRAM_LABELS),
    "kueue_quota_reserved_workloads_total": ("counter", _KUEUE_HISTOGRAM_LABELS),
    "kueue_evicted_workloads_total": (
        "counter",
        frozenset(
            {"cluster_queue", "reason", "underlying_cause", "priority_class", "replica_role"}
        ),
    ),
    "kueue_admission_wait_time_seconds": ("histogram", _KUEUE_HISTOGRAM_LABELS),
    "kueue_admission_checks_wait_time_seconds": ("histogram", _KUEUE_HISTOGRAM_LABELS),
    "kueue_quota_reserved_wait_time_seconds": ("histogram", _KUEUE_HISTOGRAM_LABELS),
}
"""Kueue v0.17.0 families (pkg/metrics/metrics.go), the same names and base labels in v0.19.2,
the Go client's names: counters are named with `_total` there, histograms get
`_bucket`/`_sum`/`_count`."""

FUNCTIONS = frozenset(
    {
        "abs",
        "absent",
        "absent_over_time",
        "avg_over_time",
        "ceil",
        "changes",
        "clamp",
        "clamp_max",
        "clamp_min",
        "count_over_time",
        "day_of_month",
        "day_of_week",
        "day_of_year",
        "days_in_month",
        "delta",
        "deriv",
        "exp",
        "floor",
        "histogram_avg",
        "histogram_count",
        "histogram_fraction",
        "histogram_quantile",
        "histogram_stddev",
        "histogram_stdvar",
        "histogram_sum",
        "idelta",
        "increase",
        "irate",
        "label_join",
        "label_replace",
        "last_over_time",
        "ln",
        "log10",
        "log2",
        "max_over_time",
        "min_over_time",
        "minute",
        "hour",
        "month",
        "predict_linear",
        "present_over_time",
        "quantile_over_time",
        "rate",
        "resets",
        "round",
        "scalar",
        "sgn",
        "sort",
        "sort_desc",
        "stddev_over_time",
        "stdvar_over_time",
        "sum_over_time",
        "time",
        "timestamp",
        "vector",
        "year",
        "start",
        "end",
    }
)
AGGREGATORS = frozenset(
    {
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    }
)
GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
KEYWORDS = frozenset({"and", "or", "unless", "offset", "bool", "atan2", "inf", "nan"})

LEADER_ONLY_GAUGES = frozenset(
    {
        "taugrid_nodes",
        "taugrid_quarantined_nodes",
        "taugrid_quarantine_breaker_open",
        "taugrid_quarantine_dry_run",
        "taugrid_runs",
        "taugrid_admission_check_active",
    }
)
"""Gauges set by a leader's pass: a follower keeps the values of its last term."""
LEADER_JOIN = "and on (instance) (taugrid_controller_leader == 1)"


# ---------------------------------------------------------------- what we export


def _samples_of(name: str, kind: str) -> tuple[str, ...]:
    """Sample names of a family as exposed in the text format."""
    if kind == "counter":
        return (name if name.endswith("_total") else f"{name}_total",)
    if kind == "gauge":
        return (name,)
    if kind == "histogram":
        return (f"{name}_bucket", f"{name}_sum", f"{name}_count")
    msg = f"{name}: family type {kind} is not handled by this test; extend _samples_of"
    raise AssertionError(msg)


def controller_series() -> dict[str, frozenset[str]]:
    """Sample name -> label names, for every family in the controller's registry."""
    m = controller_metrics.make_metrics()
    out: dict[str, frozenset[str]] = {}
    wrappers = [
        getattr(m, f.name)
        for f in dataclasses.fields(m)
        if isinstance(getattr(m, f.name), prom.metrics.MetricWrapperBase)
    ]
    for wrapper in wrappers:
        (family,) = wrapper.describe()
        labels = frozenset(wrapper._labelnames)
        for sample in _samples_of(family.name, family.type):
            out[sample] = labels | ({"le"} if sample.endswith("_bucket") else frozenset())
    registered = {f.name for f in m.registry.collect()}
    described = {next(iter(w.describe())).name for w in wrappers}
    assert registered == described, "a registered family is not a ControllerMetrics field"
    return out


def agent_series() -> dict[str, frozenset[str]]:
    """Sample name -> label names, from the agent's rendered `/metrics` and its family table."""
    snapshot = readings.GpuSnapshot(
        index=0, uuid=UUID, name="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:18:00.0",
        taken_at=T0, temperature_c=40.0,
    )  # fmt: skip
    state = latching.NodeState(
        boot_id="b",
        gpus={UUID: latching.GpuState(uuid=UUID, index=0, xid_counts={79: 1})},
    )
    view = snapshots.View(
        node_name="gpu-node-0", boot_id="b", taken_at=T0, driver_version="550.54.15",
        nvml_available=True, snapshots=(snapshot,),
        verdicts=(verdicts.GpuVerdict(UUID, 0, health.Verdict.HEALTHY, health.Action.NONE, ()),),
        state=state, last_xid={0: 79}, probe_seconds={"gauges": 0.001},
        probe_errors={"gauges:NotSupported": 1},
    )  # fmt: skip
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(agent_metrics.render(view)):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    # The snapshot only has a temperature; every other dcgm-exporter family has its labels.
    dcgm_labels = out["DCGM_FI_DEV_GPU_TEMP"]
    for dcgm in agent_metrics.DCGM_FAMILIES:
        out.setdefault(dcgm.name, set()).update(dcgm_labels)
    out.setdefault(agent_metrics.XID_FAMILY[0], set()).update(dcgm_labels)
    return {name: frozenset(labels) for name, labels in out.items()}


def kueue_series() -> dict[str, frozenset[str]]:
    """Sample name -> label names for the Kueue families listed in KUEUE_FAMILIES."""
    out: dict[str, frozenset[str]] = {}
    for name, (kind, labels) in KUEUE_FAMILIES.items():
        for sample in _samples_of(name, kind):
            out[sample] = labels | ({"le"} if sample.endswith("_bucket") else frozenset())
    return out


CONTROLLER = controller_series()
AGENT = agent_series()
KNOWN: dict[str, frozenset[str]] = {
    **{name: labels for name, labels in EXPECTED_SOON.items() if name not in CONTROLLER},
    **CONTROLLER,
    **AGENT,
    **kueue_series(),
    "up": frozenset(),
}

LITERAL_LABEL_VALUES: dict[tuple[str, str], tuple[pathlib.Path, frozenset[str]]] = {
    ("taugrid_heartbeats_total", "outcome"): (
        REPO / "controller" / "fleet" / "api.py",
        frozenset({"accepted", "forwarded", "rejected"}),
    ),
    ("taugrid_evictions_total", "outcome"): (
        REPO / "controller" / "fleet" / "quarantining.py",
        frozenset({"evicted", "blocked", "failed"}),
    ),
    ("taugrid_quarantine_actions_total", "dry_run"): (
        REPO / "controller" / "fleet" / "quarantining.py",
        frozenset({"true", "false"}),
    ),
    ("taugrid_run_attempts_total", "outcome"): (
        REPO / "controller" / "runs",
        frozenset({"started", "Succeeded"}),
    ),
}
"""Label values written as string literals in the code (the test checks they still are)."""

_ROLES = frozenset({"leader", "follower", "standalone"})
LABEL_VALUES: dict[tuple[str, str], frozenset[str]] = {
    ("taugrid_nodes", "state"): frozenset(state.NodeState),
    ("taugrid_gpu_verdict", "verdict"): frozenset(health.Verdict),
    ("taugrid_gpu_action", "action"): frozenset(health.Action),
    ("taugrid_quarantine_actions_total", "action"): frozenset(actions.ActionKind),
    ("taugrid_runs", "phase"): frozenset(records.Phase),
    ("taugrid_run_resumes_total", "failure_class"): frozenset(specs.FailureClass),
    ("taugrid_admission_decisions_total", "state"): frozenset(views.CheckState),
    ("taugrid_gpu_xid_total", "xid"): frozenset(str(code) for code in xid.CATALOG),
    ("kueue_pending_workloads", "status"): frozenset({"active", "inadmissible"}),
    ("kueue_pending_workloads", "replica_role"): _ROLES,
    ("kueue_admission_checks_wait_time_seconds_bucket", "replica_role"): _ROLES,
    **{key: values for key, (_, values) in LITERAL_LABEL_VALUES.items()},
}
LABEL_VALUES[("taugrid_run_attempts_total", "outcome")] |= frozenset(specs.FailureClass)
"""Values an enum-like label takes: the code's enums, or literals checked below."""


# ---------------------------------------------------------------- a small PromQL reader

_TOKEN = re.compile(
    r"""
      (?P<ws>\s+)
    | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    | (?P<var>\$\{[^}]*\}|\$\w+)
    | (?P<number>(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+)(?:ms|[smhdwy]|\d)*)
    | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
    | (?P<op>=~|!~|==|!=|<=|>=|[-+*/%^<>=,(){}\[\]@])
    """,
    re.VERBOSE,
)
_PAIRS = {"(": ")", "{": "}", "[": "]"}


@dataclasses.dataclass(frozen=True)
class Selector:
    """One vector selector: a metric name and its label matchers (label, op, value)."""

    metric: str
    matchers: tuple[tuple[str, str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class PromQL:
    """What an expression refers to."""

    selectors: tuple[Selector, ...]
    functions: frozenset[str]
    grouping: frozenset[str]


def tokenize(expr: str) -> list[tuple[str, str]]:
    """Split an expression into (kind, text) tokens; raise ValueError on anything else."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if match is None:
            msg = f"unexpected {expr[pos]!r} at {pos} in {expr!r}"
            raise ValueError(msg)
        kind = match.lastgroup or ""
        if kind != "ws":
            tokens.append((kind, match.group()))
        pos = match.end()
    stack: list[str] = []
    for kind, text in tokens:
        if kind == "op" and text in _PAIRS:
            stack.append(_PAIRS[text])
        elif kind == "op" and text in _PAIRS.values() and (not stack or stack.pop() != text):
            msg = f"unbalanced {text!r} in {expr!r}"
            raise ValueError(msg)
    if stack:
        msg = f"unclosed {stack[-1]!r} expected in {expr!r}"
        raise ValueError(msg)
    return tokens


def _matchers(tokens: list[tuple[str, str]], i: int) -> tuple[list[tuple[str, str, str]], int]:
    """Read `{label op "value", ...}` starting at the `{`; return the matchers and the index
    after the `}`."""
    out: list[tuple[str, str, str]] = []
    i += 1
    while tokens[i] != ("op", "}"):
        (lk, label), (ok, op), (vk, value) = tokens[i : i + 3]
        if lk != "ident" or ok != "op" or op not in {"=", "!=", "=~", "!~"} or vk != "string":
            msg = f"malformed label matcher near {label!r}"
            raise ValueError(msg)
        out.append((label, op, value[1:-1]))
        i += 3
        if tokens[i] == ("op", ","):
            i += 1
    return out, i + 1


def parse(expr: str) -> PromQL:
    """Find the selectors, function calls and grouping labels of a PromQL expression."""
    tokens = tokenize(expr)
    selectors: list[Selector] = []
    functions: set[str] = set()
    grouping: set[str] = set()
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ("", "")
        if (kind, text) == ("op", "["):  # a range or subquery: durations and variables only
            i = next(j for j in range(i, len(tokens)) if tokens[j] == ("op", "]")) + 1
        elif (kind, text) == ("op", "{"):  # a selector by __name__ only
            matchers, i = _matchers(tokens, i)
            name = next((v for label, op, v in matchers if label == "__name__" and op == "="), "")
            selectors.append(Selector(name, tuple(matchers)))
        elif kind != "ident":
            i += 1
        elif text in GROUPING:
            i += 1
            if nxt == ("op", "("):
                end = next(j for j in range(i, len(tokens)) if tokens[j] == ("op", ")"))
                grouping.update(t for k, t in tokens[i + 1 : end] if k == "ident")
                i = end + 1
        elif text in KEYWORDS:
            i += 1
        elif text in AGGREGATORS or nxt == ("op", "("):
            functions.add(text)
            i += 1
        elif nxt == ("op", "{"):
            matchers, i = _matchers(tokens, i + 1)
            selectors.append(Selector(text, tuple(matchers)))
        else:
            selectors.append(Selector(text))
            i += 1
    return PromQL(tuple(selectors), frozenset(functions), frozenset(grouping))


def _values(op: str, value: str) -> frozenset[str] | None:
    """The literal values a matcher names, or None when it is a real regex or a variable."""
    if "$" in value:
        return None
    if op in {"=", "!="}:
        return frozenset({value})
    if re.fullmatch(r"[\w-]+(\|[\w-]+)*", value):
        return frozenset(value.split("|"))
    return None


def problems(expr: str, known: Mapping[str, frozenset[str]] = KNOWN) -> list[str]:
    """Everything wrong with one expression, in words (empty when it is fine)."""
    try:
        query = parse(expr)
    except (ValueError, StopIteration) as err:
        return [f"does not parse: {err}"]
    out = [f"unknown function {f}()" for f in sorted(query.functions - FUNCTIONS - AGGREGATORS)]
    seen_labels: set[str] = set(SCRAPE_LABELS)
    for sel in query.selectors:
        if sel.metric not in known:
            where = (
                "a taugrid_* name the code does not export"
                if sel.metric.startswith("taugrid_")
                else "a DCGM_FI_* family the agent does not render"
                if sel.metric.startswith("DCGM_FI_")
                else "a kueue_* family not checked against Kueue's source"
                if sel.metric.startswith("kueue_")
                else "not ours, not dcgm-exporter's, not Kueue's, not up"
            )
            out.append(f"{sel.metric or '<no name>'}: {where}")
            continue
        labels = known[sel.metric] | SCRAPE_LABELS
        seen_labels |= labels
        for label, op, value in sel.matchers:
            if label not in labels and label != "__name__":
                out.append(f"{sel.metric} has no label {label!r}")
                continue
            allowed = LABEL_VALUES.get((sel.metric, label))
            named = _values(op, value)
            if allowed is not None and named is not None and not named <= allowed:
                out.append(f"{sel.metric}{{{label}}} never takes {sorted(named - allowed)}")
    out.extend(
        f"grouping by {label!r}, a label none of its series has"
        for label in sorted(query.grouping - seen_labels - {"le"})
    )
    return out


# ---------------------------------------------------------------- the files


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana would read it."""
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def alert_rules() -> list[dict[str, Any]]:
    """Every rule of every group."""
    data = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in data["groups"] for rule in group["rules"]]


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    for panel in items:
        yield panel
        yield from panels(panel.get("panels") or [])


def dashboard_exprs() -> list[tuple[str, str]]:
    """(where, expr) of every query in the dashboard."""
    return [
        (f"panel {panel['title']!r} {target.get('refId')}", target.get("expr", ""))
        for panel in panels(dashboard()["panels"])
        for target in panel.get("targets") or []
    ]


def all_exprs() -> list[tuple[str, str]]:
    """(where, expr) of every PromQL expression in both files."""
    alerts = [(f"alert {r.get('alert')}", str(r.get("expr", ""))) for r in alert_rules()]
    return dashboard_exprs() + alerts


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown document (code blocks skipped)."""
    out: set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.*)", line)):
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            out.add(text.replace(" ", "-"))
    return out


def xid_verdict(code: int, *, remap_failure: bool) -> health.Verdict:
    """The verdict the agent's fault table gives a GPU for one Xid (the Xid's own reason)."""
    snapshot = readings.GpuSnapshot(index=0, uuid=UUID, taken_at=T0, remap_failure=remap_failure)
    event = readings.XidEvent(xid=code, at=T0, source=readings.XidSource.NVML, gpu_index=0)
    _, verdict = verdicts.evaluate_gpu(
        latching.GpuState(uuid=UUID, index=0), snapshot, [event], diag=None, gpu_health=None,
        boot_id="b", policy=verdicts.Policy(), now=T0,
    )  # fmt: skip
    own = [r.verdict for r in verdict.reasons if r.xid == code]
    return health.worst_verdict(own)


def xid_matchers(expr: str) -> list[frozenset[str]]:
    """The Xid sets named by each `xid` matcher of an expression."""
    out: list[frozenset[str]] = []
    for sel in parse(expr).selectors:
        for label, op, value in sel.matchers:
            if label == "xid":
                named = _values(op, value)
                assert named is not None, f"xid matcher {value!r} is not a list of Xids"
                out.append(named)
    return out


def rule(name: str) -> dict[str, Any]:
    """One alert rule by name."""
    return next(r for r in alert_rules() if r.get("alert") == name)


# ---------------------------------------------------------------- the reader itself


@pytest.mark.parametrize(
    ("expr", "selectors", "functions", "grouping"),
    [
        pytest.param(
            'sum by (state) (taugrid_nodes{state="Stale"} and on (instance) '
            "(taugrid_controller_leader == 1))",
            [Selector("taugrid_nodes", (("state", "=", "Stale"),)),
             Selector("taugrid_controller_leader")],
            {"sum"}, {"state", "instance"},
            id="an aggregation with a leader join yields both selectors and the grouping labels",
        ),
        pytest.param(
            "histogram_quantile(0.99, sum by (le) (rate(x_bucket[$__rate_interval])))",
            [Selector("x_bucket")], {"histogram_quantile", "sum", "rate"}, {"le"},
            id="a range with a Grafana variable is skipped",
        ),
        pytest.param(
            'absent(up{job=~".*taugrid-controller.*"} == 1)',
            [Selector("up", (("job", "=~", ".*taugrid-controller.*"),))], {"absent"}, set(),
            id="a regex matcher keeps its value",
        ),
        pytest.param(
            "max_over_time(a{x=~\"1|2\"}[1d] offset 10m) unless sum(b) by (node) / 3",
            [Selector("a", (("x", "=~", "1|2"),)), Selector("b")],
            {"max_over_time", "sum"}, {"node"},
            id="offset, unless and a trailing by clause are keywords, not metrics",
        ),
        pytest.param(
            '{__name__="up"}', [Selector("up", (("__name__", "=", "up"),))], set(), set(),
            id="a selector by __name__ names its metric",
        ),
    ],
)  # fmt: skip
def test_parse_finds_selectors_functions_and_grouping(
    expr: str, selectors: list[Selector], functions: set[str], grouping: set[str]
) -> None:
    """The reader finds what an expression refers to and nothing else."""
    expected = PromQL(tuple(selectors), frozenset(functions), frozenset(grouping))
    assert expected == parse(expr)


@pytest.mark.parametrize(
    ("expr", "complaint"),
    [
        pytest.param("rate(taugrid_heartbeat_total[5m])", "taugrid_heartbeat_total: a taugrid_*",
                     id="a taugrid name that is not exported"),
        pytest.param("taugrid_quarantine_actions", "taugrid_quarantine_actions: a taugrid_*",
                     id="a counter without its _total suffix"),
        pytest.param("taugrid_run_queue_seconds", "taugrid_run_queue_seconds: a taugrid_*",
                     id="a histogram without its _bucket suffix"),
        pytest.param("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE: a DCGM",
                     id="a dcgm-exporter profiling family the agent cannot supply"),
        pytest.param("kueue_pending_workload", "kueue_pending_workload: a kueue_*",
                     id="a misspelt Kueue family"),
        pytest.param("node_load1", "node_load1: not ours", id="someone else's metric"),
        pytest.param('taugrid_nodes{state="Healty"}', "never takes ['Healty']",
                     id="a label value the code never writes"),
        pytest.param('taugrid_gpu_verdict{Hostname="n"}', "has no label 'Hostname'",
                     id="a label our own agent families do not carry"),
        pytest.param("sum by (nodes) (taugrid_gpu_latched_faults)", "grouping by 'nodes'",
                     id="grouping by a label no series has"),
        pytest.param("histogram_quantille(0.9, x)", "unknown function histogram_quantille",
                     id="a misspelt function"),
        pytest.param("sum(rate(taugrid_heartbeats_total[5m])", "does not parse",
                     id="an unbalanced parenthesis"),
    ],
)  # fmt: skip
def test_problems_are_reported(expr: str, complaint: str) -> None:
    """Each kind of mistake is caught, so the checks below can fail."""
    found = problems(expr)
    assert any(complaint in p for p in found), found


def test_known_names_come_from_the_code() -> None:
    """The names the checks accept are read from the registries, suffixes included."""
    assert "taugrid_heartbeats_total" in CONTROLLER
    assert "taugrid_fault_to_quarantine_seconds_bucket" in CONTROLLER
    assert "taugrid_controller_leader" in CONTROLLER
    assert "taugrid_gpu_xid_total" in AGENT
    assert "DCGM_FI_DEV_XID_ERRORS" in AGENT
    assert "Hostname" in AGENT["DCGM_FI_DEV_POWER_USAGE"]
    assert "Hostname" not in AGENT["taugrid_gpu_verdict"]


@pytest.mark.parametrize("name", sorted(EXPECTED_SOON))
def test_expected_soon_names_match_once_exported(name: str) -> None:
    """A family announced ahead of its code is exported, once it is, as announced."""
    base = name.removesuffix("_total")
    exported = {n for n in CONTROLLER if n in {base, name} or n.startswith(f"{base}_")}
    if not exported:
        pytest.skip(f"{name} is not registered in controller/metrics.py yet")
    assert {name} == exported
    assert EXPECTED_SOON[name] == CONTROLLER[name]


@pytest.mark.parametrize(
    ("key", "where", "value"),
    [pytest.param(key, path, value, id=f"{key[0]} {key[1]}={value}")
     for key, (path, values) in LITERAL_LABEL_VALUES.items() for value in sorted(values)],
)  # fmt: skip
def test_literal_label_values_are_still_written(
    key: tuple[str, str], where: pathlib.Path, value: str
) -> None:
    """Label values the checks accept as literals still appear as literals in the code (of the
    module, or of any module of the package, that writes the family)."""
    files = sorted(where.glob("*.py")) if where.is_dir() else [where]
    text = "\n".join(f.read_text(encoding="utf-8") for f in files)
    assert f'"{value}"' in text, f"{key}: {value!r} not in {where}"


# ---------------------------------------------------------------- both files


@pytest.mark.parametrize(("where", "expr"), all_exprs(), ids=[w for w, _ in all_exprs()])
def test_every_expression_names_only_what_exists(where: str, expr: str) -> None:
    """Metric names, label names and enum-like label values are all ones that exist."""
    assert expr.strip(), f"{where}: empty expression"
    assert problems(expr) == []


def test_leader_only_gauges_are_read_from_the_leader() -> None:
    """Gauges a follower keeps stale are joined with the leader flag wherever they are used."""
    wrong = [
        where
        for where, expr in all_exprs()
        if {s.metric for s in parse(expr).selectors} & LEADER_ONLY_GAUGES
        and LEADER_JOIN not in " ".join(expr.split())
    ]
    assert wrong == []


# ---------------------------------------------------------------- the dashboard


def test_dashboard_basics() -> None:
    """Grafana 10+ schema, a Prometheus datasource variable, node and Hostname variables."""
    d = dashboard()
    assert d["schemaVersion"] >= 38
    assert d["uid"]
    assert d["title"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name, label in (("node", "node"), ("Hostname", "Hostname")):
        var = variables[name]
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((?P<selector>.+),\s*(?P<label>\w+)\)", query)
        assert m is not None, f"{name}: {query!r} is not label_values(selector, label)"
        assert label == m.group("label")
        assert problems(m.group("selector")) == []
        (selector,) = parse(m.group("selector")).selectors
        assert label in KNOWN[selector.metric] | SCRAPE_LABELS
        assert var["datasource"]["uid"] == "${datasource}"


def test_dashboard_panels_are_well_formed() -> None:
    """Unique ids, the datasource variable everywhere, queries with unique refIds, and a grid
    24 columns wide without overlaps."""
    d = dashboard()
    all_panels = list(panels(d["panels"]))
    ids = [p["id"] for p in all_panels]
    assert sorted(set(ids)) == sorted(ids)
    taken: list[tuple[int, int, int, int, str]] = []
    for p in all_panels:
        g = p["gridPos"]
        assert g["x"] >= 0, p["title"]
        assert g["w"] > 0, p["title"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x, y, w, h, other in taken:
            overlap = (
                g["x"] < x + w and x < g["x"] + g["w"] and g["y"] < y + h and y < g["y"] + g["h"]
            )
            assert not overlap, f"{p['title']!r} overlaps {other!r}"
        taken.append((g["x"], g["y"], g["w"], g["h"], p["title"]))
        assert p["title"].strip()
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        targets = p["targets"]
        assert targets, p["title"]
        refs = [t["refId"] for t in targets]
        assert sorted(set(refs)) == sorted(refs), p["title"]
        for t in targets:
            assert t.get("datasource", p["datasource"]) == p["datasource"], p["title"]


def test_dashboard_legends_name_labels_the_query_has() -> None:
    """A `{{label}}` in a legend names a label the query's series can carry."""
    wrong: list[str] = []
    for panel in panels(dashboard()["panels"]):
        for target in panel.get("targets") or []:
            query = parse(target["expr"])
            carried = set(query.grouping) | SCRAPE_LABELS
            for sel in query.selectors:
                carried |= KNOWN.get(sel.metric, frozenset())
            wrong.extend(
                f"{panel['title']!r} {target['refId']}: {{{{{label}}}}}"
                for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", ""))
                if label not in carried
            )
    assert wrong == []


def test_dashboard_covers_what_on_call_needs() -> None:
    """The fleet, Xid, quarantine, heartbeat, queue, run and GPU telemetry families are all
    on the dashboard."""
    used = {s.metric for _, expr in dashboard_exprs() for s in parse(expr).selectors}
    required = {
        "taugrid_nodes", "taugrid_gpu_verdict", "taugrid_gpu_latched_faults",
        "taugrid_gpu_xid_total", "DCGM_FI_DEV_XID_ERRORS", "taugrid_quarantined_nodes",
        "taugrid_quarantine_actions_total", "taugrid_fault_to_quarantine_seconds_bucket",
        "taugrid_evictions_total", "taugrid_quarantine_breaker_open",
        "taugrid_quarantine_dry_run", "taugrid_heartbeats_total",
        "taugrid_heartbeat_handle_seconds_bucket", "taugrid_run_queue_seconds_bucket",
        "taugrid_runs", "taugrid_run_attempts_total", "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", *EXPECTED_SOON,
    }  # fmt: skip
    assert set() == required - used


def test_kueue_panels_say_they_show_kueue_metrics() -> None:
    """A panel built on Kueue's own families says so in its title."""
    unlabelled = [
        p["title"]
        for p in panels(dashboard()["panels"])
        if any(
            s.metric.startswith("kueue_")
            for t in p.get("targets") or []
            for s in parse(t["expr"]).selectors
        )
        and "Kueue" not in p["title"]
    ]
    assert unlabelled == []


# ---------------------------------------------------------------- the alerts

RULE_KEYS = frozenset({"alert", "expr", "for", "keep_firing_for", "labels", "annotations"})
DURATION = re.compile(r"(\d+(ms|[smhdwy]))+")


def test_alert_file_is_a_rule_file() -> None:
    """`groups:` only; named groups, each with rules that have `alert` and `expr`."""
    data = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    assert list(data) == ["groups"]
    names = [g["name"] for g in data["groups"]]
    assert sorted(set(names)) == sorted(names)
    for group in data["groups"]:
        assert {"name", "rules"} == set(group), group["name"]
        assert group["rules"], group["name"]
        for r in group["rules"]:
            assert set(r) <= RULE_KEYS, r
            assert isinstance(r.get("alert"), str), r
            assert r["alert"], r
            assert isinstance(r.get("expr"), str), r["alert"]
            assert r["expr"].strip(), r["alert"]
            for key in ("for", "keep_firing_for"):
                if key in r:
                    assert DURATION.fullmatch(str(r[key])), f"{r['alert']}: {key} {r[key]!r}"


def test_alerts_have_severity_summary_description_and_runbook() -> None:
    """Unique names; each alert has a severity, a summary, a description and a runbook link to
    a section of docs/oncall.md named after it."""
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert sorted(set(names)) == sorted(names)
    sections = anchors(ONCALL.read_text(encoding="utf-8"))
    for r in rules:
        name = r["alert"]
        assert re.fullmatch(r"TauGrid[A-Z][A-Za-z]+", name), name
        assert r["labels"]["severity"] in {"critical", "warning", "info"}, name
        notes = r["annotations"]
        for key in ("summary", "description", "runbook_url"):
            assert str(notes.get(key, "")).strip(), f"{name}: no {key}"
        m = re.fullmatch(r"(?:.*/)?docs/oncall\.md#(?P<anchor>[a-z0-9-]+)", notes["runbook_url"])
        assert m is not None, f"{name}: {notes['runbook_url']!r}"
        assert name.lower() == m.group("anchor")
        assert m.group("anchor") in sections, f"{name}: docs/oncall.md has no section {name}"
        for text in notes.values():
            assert str(text).count("{{") == str(text).count("}}"), name


def test_alert_templates_name_labels_the_expression_keeps() -> None:
    """`$labels.x` in an annotation names a label the alert's series can carry."""
    for r in alert_rules():
        query = parse(r["expr"])
        carried = set(query.grouping) | SCRAPE_LABELS
        for sel in query.selectors:
            carried |= KNOWN.get(sel.metric, frozenset())
        for text in r["annotations"].values():
            for label in re.findall(r"\$labels\.(\w+)", str(text)):
                assert label in carried, f"{r['alert']}: $labels.{label}"


def test_fatal_xid_alert_names_exactly_the_xids_that_fail_a_gpu() -> None:
    """The Xids of the fatal-Xid alert are those whose own verdict is Failed in the agent's
    fault table (not a list copied by hand)."""
    fatal = {
        str(code)
        for code in xid.CATALOG
        if xid_verdict(code, remap_failure=False) is health.Verdict.FAILED
    }
    assert {"79", "62", "95", "109", "119", "120", "140", "143"} <= fatal
    assert not {"13", "31", "43", "48", "64", "92", "94"} & fatal
    sets = xid_matchers(rule("TauGridFatalXid")["expr"])
    assert sets
    assert all(fatal == s for s in sets), sets


def test_ecc_xid_alert_names_the_xids_that_fail_only_with_a_remap_failure() -> None:
    """Xid 48 and 64 are Degraded, or Failed when the row remapper reports a failure."""
    conditional = {
        str(code)
        for code in xid.CATALOG
        if xid_verdict(code, remap_failure=False) is not health.Verdict.FAILED
        and xid_verdict(code, remap_failure=True) is health.Verdict.FAILED
    }
    assert {"48", "64"} == conditional
    sets = xid_matchers(rule("TauGridEccXid")["expr"])
    assert sets
    assert all(conditional == s for s in sets), sets


@pytest.mark.parametrize(
    ("alert", "metric"),
    [
        pytest.param("TauGridQuarantineBreakerOpen", "taugrid_quarantine_breaker_open",
                     id="breaker open"),
        pytest.param("TauGridHeartbeatsStale", "taugrid_nodes", id="stale heartbeats"),
        pytest.param("TauGridControllerDown", "up", id="controller down"),
        pytest.param("TauGridControllerNoLeader", "taugrid_controller_leader", id="no leader"),
        pytest.param("TauGridAdmissionCheckInactive", "taugrid_admission_check_active",
                     id="admission check inactive"),
        pytest.param("TauGridRunInfraFailures", "taugrid_run_attempts_total",
                     id="run failures by class"),
    ],
)  # fmt: skip
def test_required_alerts_exist(alert: str, metric: str) -> None:
    """The alerts on-call relies on exist and read the family that expresses them."""
    assert metric in {s.metric for s in parse(rule(alert)["expr"]).selectors}


def test_stale_alert_counts_the_stale_state() -> None:
    """Stale is the node state whose condition reason is HeartbeatStale."""
    (sel,) = [s for s in parse(rule("TauGridHeartbeatsStale")["expr"]).selectors
              if s.metric == "taugrid_nodes"]  # fmt: skip
    assert (("state", "=", str(state.NodeState.STALE)),) == sel.matchers
    assert state.REASON_HEARTBEAT_STALE == "HeartbeatStale"
