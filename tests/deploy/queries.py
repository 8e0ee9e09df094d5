"""The PromQL of deploy/: every query of the Grafana dashboard, every rule expression, the HPA's
metric, and the metric names they read.

Metric names are found by removing what is not one (strings, label matchers, range selectors,
grouping clauses, function calls, keywords, numbers); Grafana's variables are replaced by values
PromQL accepts ($__rate_interval -> 5m, $var -> .*)."""
import json
import re

import yaml

KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
            "group_left", "group_right", "inf", "nan", "Inf", "NaN", "atan2",
            # aggregation operators, which may stand before their grouping clause
            "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
            "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
# Series Prometheus itself makes for every target.
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


def grafana_to_promql(expr):
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*", expr)


def dashboard_queries(path):
    """(where, PromQL) of every panel target and query variable."""
    with open(path) as f:
        dash = json.load(f)
    found = []

    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dash.get("panels", [])):
        for t in p.get("targets", []):
            if t.get("expr"):
                found.append((f"panel '{p.get('title')}' {t.get('refId')}",
                              grafana_to_promql(t["expr"])))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
        # label_values(<series selector>, <label>): only the selector is PromQL.
        m = re.match(r"^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$", q)
        found.append((f"variable ${v['name']}", grafana_to_promql(m.group(1) if m else q)))
    return found


def rule_queries(paths):
    """(where, PromQL) of every rule, and the set of names the recording rules define."""
    found, recorded = [], set()
    for path in paths:
        with open(path) as f:
            doc = yaml.safe_load(f)
        for group in doc.get("groups", []):
            for rule in group.get("rules", []):
                name = rule.get("record") or rule.get("alert")
                found.append((f"{path}: {name}", rule["expr"]))
                if "record" in rule:
                    recorded.add(rule["record"])
    return found, recorded


def metric_names(expr):
    """The metric names an expression reads."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r" \1 ", s)
    names = set()
    for m in re.finditer(r"(?<![A-Za-z0-9_.:])[A-Za-z_:][A-Za-z0-9_:]*", s):
        token = m.group(0)
        if token in KEYWORDS or s[m.end():].lstrip().startswith("("):
            continue
        names.add(token)
    return names


def exposed_names(exposition):
    """Series names in a /metrics text: every sample's name, plus each family's name from its
    TYPE line (with _bucket/_sum/_count for histograms, _sum/_count for summaries), so a family
    that has no sample yet (a label set not used so far) still counts."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()[:4]
            names.add(name)
            if kind == "histogram":
                names.update({f"{name}_bucket", f"{name}_sum", f"{name}_count"})
            elif kind == "summary":
                names.update({f"{name}_sum", f"{name}_count"})
        elif line and not line.startswith("#"):
            names.add(re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0))
    return names


def registry_names(source):
    """Names a prometheus-cpp registry source file registers: `.Name("x")` builders and the
    `Hist/Gauge/Counter(registry, "x", ...)` helpers, expanded as exposed_names does."""
    names = set()
    for m in re.finditer(r'\.Name\("([a-z_:][a-z0-9_:]*)"\)', source):
        names.add(m.group(1))
    for m in re.finditer(r'\b(Hist|Gauge|Counter)\(\s*\w+,\s*"([a-z_:][a-z0-9_:]*)"', source):
        names.add(m.group(2))
        if m.group(1) == "Hist":
            names.update({f"{m.group(2)}_bucket", f"{m.group(2)}_sum", f"{m.group(2)}_count"})
    for m in re.finditer(r'BuildHistogram\(\)\s*\.Name\("([a-z_:][a-z0-9_:]*)"\)', source):
        names.update({f"{m.group(1)}_bucket", f"{m.group(1)}_sum", f"{m.group(1)}_count"})
    return names


def hpa_metric_names(objects):
    return {(o["metadata"]["name"], m["pods"]["metric"]["name"])
            for o in objects if o["kind"] == "HorizontalPodAutoscaler"
            for m in o["spec"].get("metrics", []) if m["type"] == "Pods"}
