#!/usr/bin/env python3
"""Generate the fanout Grafana dashboard (deploy/grafana/fanout.json and the Helm chart's copy).

The panels query only the names of the metric catalog (docs/operations.md; the test
crates/fanout-cli/tests/dashboard.rs checks every name a query uses). Edit this file, not the
JSON, then run it:

    python3 deploy/grafana/generate.py           # rewrite both files
    python3 deploy/grafana/generate.py --check   # exit 1 if either file is not up to date

The datasource is the `${DS_PROMETHEUS}` input (asked for when the JSON is imported in the UI)
and also a dashboard variable of that name, so the same JSON works when provisioned by Grafana's
dashboard sidecar (no import step, the variable picks the default Prometheus).
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTPUTS = [
    ROOT / "deploy/grafana/fanout.json",
    ROOT / "deploy/helm/fanout/dashboards/fanout.json",
]

DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
# Label filters of the dashboard variables.
SEL = 'job=~"$job", instance=~"$instance"'
ROUTE = SEL + ', route=~"$route"'
BACKEND = SEL + ', backend=~"$backend"'
RI = "[$__rate_interval]"


class Layout:
    """Places panels left to right in rows of 24 columns."""

    def __init__(self):
        self.panels = []
        self.y = 0
        self.x = 0
        self.row_h = 0
        self.next_id = 1

    def _id(self):
        i = self.next_id
        self.next_id += 1
        return i

    def row(self, title):
        self._newline()
        self.panels.append({
            "type": "row", "id": self._id(), "title": title, "collapsed": False,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": [],
        })
        self.y += 1

    def _newline(self):
        if self.x > 0:
            self.y += self.row_h
            self.x = 0
            self.row_h = 0

    def add(self, panel, w, h):
        if self.x + w > 24:
            self._newline()
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def targets(exprs):
    out = []
    for i, (expr, legend) in enumerate(exprs):
        out.append({
            "datasource": DS, "refId": chr(ord("A") + i), "expr": expr,
            "legendFormat": legend, "range": True, "instant": False,
        })
    return out


def timeseries(title, desc, exprs, unit="short", stack=False, min0=True, decimals=None,
               thresholds=None):
    defaults = {
        "unit": unit,
        "custom": {
            "drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if not stack else 30,
            "showPoints": "never", "spanNulls": False,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        },
    }
    if min0:
        defaults["min"] = 0
    if decimals is not None:
        defaults["decimals"] = decimals
    if thresholds:
        defaults["thresholds"] = thresholds
        defaults["custom"]["thresholdsStyle"] = {"mode": "line"}
    return {
        "type": "timeseries", "title": title, "description": desc, "datasource": DS,
        "targets": targets(exprs),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "showLegend": True,
                       "calcs": ["mean", "max", "lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def stat(title, desc, expr, unit="short", decimals=None, steps=None):
    defaults = {"unit": unit}
    if decimals is not None:
        defaults["decimals"] = decimals
    defaults["thresholds"] = {"mode": "absolute", "steps": steps or [
        {"color": "green", "value": None}]}
    return {
        "type": "stat", "title": title, "description": desc, "datasource": DS,
        "targets": targets([(expr, "")]),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value", "graphMode": "area", "justifyMode": "auto",
            "textMode": "auto", "orientation": "auto",
        },
    }


def quantiles(metric, sel, by, legend_prefix):
    """p50/p95/p99 of a histogram, per `by` label."""
    out = []
    for q in ("0.5", "0.95", "0.99"):
        p = "p" + str(int(float(q) * 100))
        out.append((
            f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{sel}}}{RI})))",
            f"{p} {legend_prefix}",
        ))
    return out


def red_yellow(yellow, red):
    return [{"color": "green", "value": None}, {"color": "yellow", "value": yellow},
            {"color": "red", "value": red}]


def build():
    L = Layout()

    L.row("Overview")
    L.add(stat("Requests/s", "All routes, every status.",
               f"sum(rate(fanout_requests_total{{{ROUTE}}}{RI}))", "reqps"), 4, 4)
    L.add(stat("5xx ratio", "Share of answers with a 5xx status.",
               f'sum(rate(fanout_requests_total{{{ROUTE}, status_class="5xx"}}{RI})) '
               f"/ sum(rate(fanout_requests_total{{{ROUTE}}}{RI}))",
               "percentunit", 2, red_yellow(0.001, 0.01)), 4, 4)
    L.add(stat("p99 latency", "All routes.",
               f"histogram_quantile(0.99, sum by (le) "
               f"(rate(fanout_request_duration_seconds_bucket{{{ROUTE}}}{RI})))", "s", 3), 4, 4)
    L.add(stat("In flight", "Requests being handled now.",
               f"sum(fanout_requests_in_flight{{{ROUTE}}})"), 4, 4)
    L.add(stat("Partial answers/s", "Answers in which an optional step fell back to its default.",
               f"sum(rate(fanout_partial_responses_total{{{ROUTE}}}{RI}))", "reqps", 2), 4, 4)
    L.add(stat("Instances", "Gateway processes scraped.",
               f'count(process_start_time_seconds{{{SEL}}})'), 4, 4)

    L.row("Requests by route")
    L.add(timeseries("Request rate by route", "Requests per second per route pattern and method.",
                     [(f"sum by (route, method) (rate(fanout_requests_total{{{ROUTE}}}{RI}))",
                       "{{method}} {{route}}")], "reqps"), 12, 8)
    L.add(timeseries("Answers by status class", "Requests per second per status class.",
                     [(f"sum by (status_class) (rate(fanout_requests_total{{{ROUTE}}}{RI}))",
                       "{{status_class}}")], "reqps", stack=True), 12, 8)
    L.add(timeseries("Error ratio by route", "Share of 5xx (and 4xx) answers per route.",
                     [(f'sum by (route) (rate(fanout_requests_total{{{ROUTE}, status_class="5xx"}}{RI})) '
                       f"/ sum by (route) (rate(fanout_requests_total{{{ROUTE}}}{RI}))",
                       "5xx {{route}}"),
                      (f'sum by (route) (rate(fanout_requests_total{{{ROUTE}, status_class="4xx"}}{RI})) '
                       f"/ sum by (route) (rate(fanout_requests_total{{{ROUTE}}}{RI}))",
                       "4xx {{route}}")], "percentunit"), 12, 8)
    L.add(timeseries("Error answers by code", "Error answers per second by `error.code`.",
                     [(f"sum by (code) (rate(fanout_errors_total{{{SEL}}}{RI}))", "{{code}}")],
                     "reqps", stack=True), 12, 8)
    L.add(timeseries("Latency by route (p50/p95/p99)",
                     "From the request's arrival to the answer, per route.",
                     quantiles("fanout_request_duration_seconds", ROUTE, "route", "{{route}}"),
                     "s"), 12, 8)
    L.add(timeseries("In flight and partial answers by route",
                     "Requests in flight; answers per second with optional steps defaulted.",
                     [(f"sum by (route) (fanout_requests_in_flight{{{ROUTE}}})", "in flight {{route}}"),
                      (f"sum by (route) (rate(fanout_partial_responses_total{{{ROUTE}}}{RI}))",
                       "partial/s {{route}}")]), 12, 8)
    L.add(timeseries("Coalesced requests by route",
                     "Requests per second answered by a run of the flow that an identical "
                     "concurrent request started (whole-request coalescing), and their share of "
                     "the route's requests; flow runs are the rest.",
                     [(f"sum by (route) (rate(fanout_requests_coalesced_total{{{ROUTE}}}{RI}))",
                       "coalesced/s {{route}}"),
                      (f"sum by (route) (rate(fanout_requests_coalesced_total{{{ROUTE}}}{RI})) "
                       f"/ sum by (route) (rate(fanout_requests_total{{{ROUTE}}}{RI}))",
                       "share {{route}}")]), 12, 8)

    L.row("Backends")
    L.add(timeseries("Calls by backend and outcome",
                     "Backend calls per second by outcome class (ok, timeout, refused, reset, "
                     "bad_answer, status_4xx, status_5xx, rejected_bulkhead, rejected_breaker, "
                     "invalid_call, rejected_pool, other).",
                     [(f"sum by (backend, outcome) (rate(fanout_backend_calls_total{{{BACKEND}}}{RI}))",
                       "{{backend}} {{outcome}}")], "reqps", stack=True), 12, 8)
    L.add(timeseries("Failed call ratio by backend", "Share of calls whose outcome is not ok.",
                     [(f'sum by (backend) (rate(fanout_backend_calls_total{{{BACKEND}, outcome!="ok"}}{RI})) '
                       f"/ sum by (backend) (rate(fanout_backend_calls_total{{{BACKEND}}}{RI}))",
                       "{{backend}}")], "percentunit"), 12, 8)
    L.add(timeseries("Call latency by backend (p50/p95/p99)", "Per step call, as the flow sees it.",
                     quantiles("fanout_backend_call_duration_seconds", BACKEND, "backend",
                               "{{backend}}"), "s"), 12, 8)
    L.add(timeseries("Calls in flight by backend", "Calls to each backend in flight now.",
                     [(f"sum by (backend) (fanout_backend_in_flight{{{BACKEND}}})", "{{backend}}")]),
          12, 8)
    L.add(timeseries("Addresses in rotation", "Addresses of each backend in rotation (not ejected).",
                     [(f"sum by (backend) (fanout_backend_address_up{{{BACKEND}}})", "up {{backend}}"),
                      (f"count by (backend) (fanout_backend_address_up{{{BACKEND}}})",
                       "all {{backend}}")], decimals=0), 8, 8)
    L.add(timeseries("Outlier ejections", "Ejections per second per address.",
                     [(f"sum by (backend, address) (rate(fanout_outlier_ejections_total{{{BACKEND}}}{RI}))",
                       "{{backend}} {{address}}")], "ops"), 8, 8)
    L.add(timeseries("Breaker state", "0 closed, 1 half-open, 2 open (highest over instances).",
                     [(f"max by (backend) (fanout_breaker_state{{{BACKEND}}})", "{{backend}}")],
                     decimals=0,
                     thresholds={"mode": "absolute", "steps": red_yellow(1, 2)}), 8, 8)
    L.add(timeseries("Retries and hedges", "Retry attempts, hedged copies and hedges that won, per second.",
                     [(f"sum by (backend) (rate(fanout_retries_total{{{BACKEND}}}{RI}))",
                       "retries {{backend}}"),
                      (f"sum by (backend) (rate(fanout_hedges_total{{{BACKEND}}}{RI}))",
                       "hedges {{backend}}"),
                      (f"sum by (backend) (rate(fanout_hedges_won_total{{{BACKEND}}}{RI}))",
                       "hedges won {{backend}}")], "ops"), 12, 8)
    L.add(timeseries("Retry budget refusals", "Retries not sent because the budget was spent.",
                     [(f"sum by (backend) (rate(fanout_retry_budget_refusals_total{{{BACKEND}}}{RI}))",
                       "{{backend}}")], "ops"), 12, 8)

    L.row("Databases")
    L.add(timeseries("Database pool connections", "Connections in use and idle per database, and its max_size.",
                     [(f"sum by (backend, state) (fanout_db_pool_connections{{{BACKEND}}})",
                       "{{backend}} {{state}}"),
                      (f"max by (backend) (fanout_db_pool_max_connections{{{BACKEND}}})",
                       "{{backend}} max")], decimals=0), 8, 8)
    L.add(timeseries("Waiting for a connection", "Calls waiting for a connection now, and the wait (p50/p95/p99).",
                     [(f"sum by (backend) (fanout_db_pool_waiting{{{BACKEND}}})", "waiting {{backend}}")]
                     + quantiles("fanout_db_pool_wait_seconds", BACKEND, "backend", "wait {{backend}}")),
          8, 8)
    L.add(timeseries("Database up", "1 while the database is reachable (lowest over instances).",
                     [(f"min by (backend) (fanout_db_up{{{BACKEND}}})", "{{backend}}")], decimals=0,
                     thresholds={"mode": "absolute", "steps": [{"color": "red", "value": None},
                                                               {"color": "green", "value": 1}]}), 8, 8)
    L.add(timeseries("Pool refusals and cancellations",
                     "Calls refused with 503 pool_exhausted (full: max_waiters waiting; wait: no connection in "
                     "time), and statements cancelled at the server at their deadline, per second.",
                     [(f"sum by (backend, reason) (rate(fanout_db_pool_rejections_total{{{BACKEND}}}{RI}))",
                       "refused {{backend}} {{reason}}"),
                      (f"sum by (backend) (rate(fanout_db_cancellations_total{{{BACKEND}}}{RI}))",
                       "cancelled {{backend}}")], "ops"), 8, 8)
    L.add(timeseries("SQL errors by class", "SQL errors per second by SQLSTATE class.",
                     [(f"sum by (backend, class) (rate(fanout_db_errors_total{{{BACKEND}}}{RI}))",
                       "{{backend}} {{class}}")], "ops", stack=True), 8, 8)
    L.add(timeseries("Rows returned", "Rows returned by statements per second.",
                     [(f"sum by (backend) (rate(fanout_db_rows_total{{{BACKEND}}}{RI}))", "{{backend}}")],
                     "ops"), 8, 8)
    L.add(timeseries("SQL errors by step", "SQL errors per second received by each sql step, by SQLSTATE class.",
                     [(f"sum by (backend, step, class) (rate(fanout_db_step_errors_total{{{BACKEND}}}{RI}))",
                       "{{step}} {{class}}")], "ops", stack=True), 8, 8)
    L.add(timeseries("Rows by step", "Rows per second received by each sql step (cached and shared answers included).",
                     [(f"sum by (backend, step) (rate(fanout_db_step_rows_total{{{BACKEND}}}{RI}))",
                       "{{backend}} {{step}}")], "ops"), 8, 8)

    L.row("Models")
    L.add(timeseries("Model rows and batches", "Rows evaluated and evaluations (batches) per second per model; "
                     "rows / batches is the mean batch.",
                     [(f"sum by (model) (rate(fanout_model_rows_total{{{SEL}}}{RI}))", "rows {{model}}"),
                      (f"sum by (model) (rate(fanout_model_batches_total{{{SEL}}}{RI}))", "batches {{model}}")],
                     "ops"), 8, 8)
    L.add(timeseries("Model batch size (p50/p95/p99)", "Rows per evaluation: grows with the load.",
                     quantiles("fanout_model_batch_rows", SEL, "model", "{{model}}")), 8, 8)
    L.add(timeseries("Model queue and compute time (p99)",
                     "How long rows waited for their model, and how long one evaluation took.",
                     [(f"histogram_quantile(0.99, sum by (le, model) "
                       f"(rate(fanout_model_queue_seconds_bucket{{{SEL}}}{RI})))", "queue {{model}}"),
                      (f"histogram_quantile(0.99, sum by (le, model) "
                       f"(rate(fanout_model_compute_seconds_bucket{{{SEL}}}{RI})))", "compute {{model}}")],
                     "s"), 8, 8)
    L.add(timeseries("Model rows waiting", "Rows in each model's queue now.",
                     [(f"sum by (model) (fanout_model_pending_rows{{{SEL}}})", "{{model}}")], decimals=0), 8, 8)
    L.add(timeseries("Model rows dropped", "Rows refused (queue_full: 503 model_queue_full), dropped past their "
                     "deadline (expired) or whose evaluation failed, per second.",
                     [(f"sum by (model, reason) (rate(fanout_model_dropped_rows_total{{{SEL}}}{RI}))",
                       "{{model}} {{reason}}")], "ops", stack=True), 8, 8)
    L.add(timeseries("Model loads", "Model files loaded (ok: swapped in) or refused (error: the version serving "
                     "goes on), in each interval.",
                     [(f"sum by (model, result) (increase(fanout_model_loads_total{{{SEL}}}{RI}))",
                       "{{model}} {{result}}")], "short"), 8, 8)
    L.add(timeseries("Model version age", "Seconds since the version serving was loaded.",
                     [(f"max by (model) (fanout_model_version_age_seconds{{{SEL}}})", "{{model}}")], "s"),
          8, 8)

    L.row("Admission and shedding")
    L.add(timeseries("Admission limit and in flight", "Concurrency limit and admitted requests per class.",
                     [(f"sum by (class) (fanout_admission_limit{{{SEL}}})", "limit {{class}}"),
                      (f"sum by (class) (fanout_admission_in_flight{{{SEL}}})", "in flight {{class}}")]),
          8, 8)
    L.add(timeseries("Admission queue", "Requests waiting for a slot per class.",
                     [(f"sum by (class) (fanout_admission_queue_length{{{SEL}}})", "{{class}}")]), 8, 8)
    L.add(timeseries("Shed requests", "Requests refused by admission per second (503), by reason.",
                     [(f"sum by (class, reason) (rate(fanout_admission_rejections_total{{{SEL}}}{RI}))",
                       "{{class}} {{reason}}")], "reqps", stack=True), 8, 8)
    L.add(timeseries("Client connections", "Open connections; connections refused at the cap per second.",
                     [(f"sum(fanout_connections_open{{{SEL}}})", "open"),
                      (f"sum(rate(fanout_connections_refused_total{{{SEL}}}{RI}))", "refused/s")]),
          12, 8)

    L.row("Caches, dedup and batching")
    L.add(timeseries("Cache hit ratio", "Hits (fresh and stale) over all lookups, per cache.",
                     [(f'sum by (cache) (rate(fanout_cache_requests_total{{{SEL}, result=~"hit|stale"}}{RI})) '
                       f"/ sum by (cache) (rate(fanout_cache_requests_total{{{SEL}}}{RI}))",
                       "{{cache}}")], "percentunit"), 8, 8)
    L.add(timeseries("Cache lookups by result", "hit, miss, stale per second per cache.",
                     [(f"sum by (cache, result) (rate(fanout_cache_requests_total{{{SEL}}}{RI}))",
                       "{{cache}} {{result}}")], "ops", stack=True), 8, 8)
    L.add(timeseries("Cache entries", "Entries per in-memory cache.",
                     [(f"sum by (cache) (fanout_cache_entries{{{SEL}}})", "{{cache}}")]), 8, 8)
    L.add(timeseries("Redis L2 by result", "Shared cache lookups per second: hit, miss, error, skipped.",
                     [(f"sum by (cache, result) (rate(fanout_cache_l2_requests_total{{{SEL}}}{RI}))",
                       "{{cache}} {{result}}")], "ops", stack=True), 8, 8)
    L.add(timeseries("Calls saved", "Calls that joined one in flight (dedup) or rode in a batch.",
                     [(f"sum by (backend) (rate(fanout_dedup_saved_calls_total{{{BACKEND}}}{RI}))",
                       "dedup {{backend}}"),
                      (f"sum by (backend) (rate(fanout_batch_saved_calls_total{{{BACKEND}}}{RI}))",
                       "batch {{backend}}")], "ops"), 8, 8)
    L.add(timeseries("Batch size (p50/p95/p99)", "Keys per batch call.",
                     quantiles("fanout_batch_size", BACKEND, "backend", "{{backend}}")), 8, 8)

    L.row("Reference data and compute")
    L.add(timeseries("Reference data age", "Seconds since each dataset was last loaded.",
                     [(f"max by (dataset) (fanout_reference_age_seconds{{{SEL}}})", "{{dataset}}")],
                     "s"), 8, 8)
    L.add(timeseries("Reference loads", "Loads per second by result.",
                     [(f"sum by (dataset, result) (rate(fanout_reference_loads_total{{{SEL}}}{RI}))",
                       "{{dataset}} {{result}}")], "ops"), 8, 8)
    L.add(timeseries("Compute pool", "Jobs waiting for the compute pool; p99 run time.",
                     [(f"sum(fanout_compute_queue_length{{{SEL}}})", "queue"),
                      (f"histogram_quantile(0.99, sum by (le) "
                       f"(rate(fanout_compute_run_seconds_bucket{{{SEL}}}{RI})))", "p99 run s")]),
          8, 8)
    L.add(timeseries("Runtime stalls", "Worker polls that held a thread past the stall threshold.",
                     [(f"sum(rate(fanout_runtime_stalls_total{{{SEL}}}{RI}))", "stalls/s")], "ops"),
          8, 8)

    L.row("Streams and WebSockets")
    L.add(stat("Event streams open", "Server-Sent Events streams open now on pass-through routes.",
               f"sum(fanout_sse_streams_open{{{ROUTE}}})"), 6, 4)
    L.add(stat("WebSockets open", "WebSockets open now over all routes (capped by "
               "server.websockets.max_connections).",
               f"sum(fanout_websockets_open{{{SEL}}})"), 6, 4)
    L.add(stat("Pass-through out", "Answer bytes per second passed to clients by pass-through routes.",
               f'sum(rate(fanout_pass_bytes_total{{{ROUTE}, direction="out"}}{RI}))', "Bps"), 6, 4)
    L.add(stat("Pass-through cuts/s", "Pass-through exchanges cut after their head (timeouts, "
               "broken bodies, body limits).",
               f"sum(rate(fanout_pass_cut_total{{{ROUTE}}}{RI}))", "ops", 2,
               red_yellow(0.01, 1)), 6, 4)
    L.add(timeseries("Open streams by route",
                     "Event streams and WebSockets open now, per route. A drop to zero on an "
                     "instance is its drain (SIGTERM): its clients reconnect elsewhere.",
                     [(f"sum by (route) (fanout_sse_streams_open{{{ROUTE}}})", "sse {{route}}"),
                      (f"sum by (route) (fanout_websocket_open{{{ROUTE}}})", "ws {{route}}")]),
          12, 8)
    L.add(timeseries("Pass-through bytes by route",
                     "Body bytes per second: in (requests to the backend), out (answers to clients).",
                     [(f"sum by (route, direction) (rate(fanout_pass_bytes_total{{{ROUTE}}}{RI}))",
                       "{{direction}} {{route}}")], "Bps"), 12, 8)
    L.add(timeseries("Event streams: events, heartbeats, ends",
                     "Events and heartbeats per second; streams ended per second by cause "
                     "(client_left, backend_ended, idle, timeout, drain, error).",
                     [(f"sum by (route) (rate(fanout_sse_events_total{{{ROUTE}}}{RI}))",
                       "events {{route}}"),
                      (f"sum by (route) (rate(fanout_sse_heartbeats_total{{{ROUTE}}}{RI}))",
                       "heartbeats {{route}}"),
                      (f"sum by (cause) (rate(fanout_sse_streams_ended_total{{{ROUTE}}}{RI}))",
                       "ended {{cause}}")], "ops"), 8, 8)
    L.add(timeseries("WebSocket messages",
                     "Data messages relayed per second: in (client to backend), out.",
                     [(f"sum by (route, direction) (rate(fanout_websocket_messages_total{{{ROUTE}}}{RI}))",
                       "{{direction}} {{route}}")], "ops"), 8, 8)
    L.add(timeseries("WebSocket closes and refusals",
                     "Closes per second by who closed first and the code (1009: too big, 1001: "
                     "idle or drain, 1006: went away); handshakes refused by reason.",
                     [(f"sum by (by, code) (rate(fanout_websocket_closes_total{{{ROUTE}}}{RI}))",
                       "closed by {{by}} {{code}}"),
                      (f"sum by (reason) (rate(fanout_websocket_refused_total{{{ROUTE}}}{RI}))",
                       "refused {{reason}}")], "ops"), 8, 8)
    L.add(timeseries("Pass-through cuts by reason",
                     "Exchanges cut per second: timeout, idle_timeout, body_too_large, "
                     "client_broke, backend_broke.",
                     [(f"sum by (route, reason) (rate(fanout_pass_cut_total{{{ROUTE}}}{RI}))",
                       "{{reason}} {{route}}")], "ops"), 12, 8)
    L.add(timeseries("WebSocket bytes",
                     "Payload bytes per second relayed, by direction.",
                     [(f"sum by (direction) (rate(fanout_websocket_bytes_total{{{ROUTE}}}{RI}))",
                       "{{direction}}")], "Bps"), 12, 8)

    L.row("Edge: TLS and compression")
    # Red under 7 days, yellow under 21 (steps read upwards: below 7 d red, then yellow, then green).
    expiry_steps = [{"color": "red", "value": None}, {"color": "yellow", "value": 7 * 86400},
                    {"color": "green", "value": 21 * 86400}]
    L.add(stat("Next certificate expiry",
               "Time until the first certificate a TLS listener presents expires (every instance, "
               "every listener); empty without TLS. Alert well before it reaches zero.",
               f"min(fanout_tls_certificate_expiry_timestamp_seconds{{{SEL}}}) - time()", "s",
               steps=expiry_steps), 6, 8)
    L.add(timeseries("Certificates: time to expiry",
                     "Per listener and certificate file; a rotated certificate jumps up when its "
                     "files are reloaded.",
                     [(f"max by (listener, name) (fanout_tls_certificate_expiry_timestamp_seconds{{{SEL}}}) - time()",
                       "{{listener}} {{name}}")], "s"), 6, 8)
    L.add(timeseries("TLS reloads and failed handshakes",
                     "Certificate and CA reloads in each interval by result (refused: the loaded "
                     "files kept serving); failed handshakes per second by reason.",
                     [(f"sum by (listener, result) (increase(fanout_tls_reloads_total{{{SEL}}}{RI}))",
                       "reload {{listener}} {{result}}"),
                      (f"sum by (listener, reason) (rate(fanout_tls_handshake_failures_total{{{SEL}}}{RI}))",
                       "failed/s {{listener}} {{reason}}")]), 12, 8)
    L.add(timeseries("Compressed answers by coding",
                     "Answers per second sent compressed, by coding; skipped: answers sent plain "
                     "because the compute pool's queue was full.",
                     [(f"sum by (coding) (rate(fanout_compressed_answers_total{{{SEL}}}{RI}))",
                       "{{coding}}"),
                      (f"sum(rate(fanout_compression_skipped_total{{{SEL}}}{RI}))", "skipped")],
                     "reqps", stack=True), 8, 8)
    L.add(timeseries("Compression ratio",
                     "Bytes sent over bytes before encoding, of the compressed answers, by coding.",
                     [(f"sum by (coding) (rate(fanout_compressed_answer_bytes_after_total{{{SEL}}}{RI})) "
                       f"/ sum by (coding) (rate(fanout_compressed_answer_bytes_before_total{{{SEL}}}{RI}))",
                       "{{coding}}")], "percentunit"), 8, 8)
    L.add(timeseries("Compressed request bodies",
                     "Request bodies decoded per second by coding; refused: not accepted, corrupt "
                     "or too large once decoded (415, 400, 413).",
                     [(f"sum by (coding) (rate(fanout_decoded_request_bodies_total{{{SEL}}}{RI}))",
                       "{{coding}}"),
                      (f"sum(rate(fanout_encoded_request_bodies_refused_total{{{SEL}}}{RI}))",
                       "refused")], "reqps"), 8, 8)

    L.row("Process and config")
    L.add(timeseries("CPU (cores used)", "CPU seconds per second per instance.",
                     [(f"rate(process_cpu_seconds_total{{{SEL}}}{RI})", "{{instance}}")]), 8, 8)
    L.add(timeseries("Resident memory", "RSS per instance.",
                     [(f"process_resident_memory_bytes{{{SEL}}}", "{{instance}}")], "bytes"), 8, 8)
    L.add(timeseries("Threads and open fds", "Per instance.",
                     [(f"process_threads{{{SEL}}}", "threads {{instance}}"),
                      (f"process_open_fds{{{SEL}}}", "fds {{instance}}")]), 8, 8)
    L.add(timeseries("Uptime", "Since each process started.",
                     [(f"time() - process_start_time_seconds{{{SEL}}}", "{{instance}}")], "s"), 8, 8)
    L.add(timeseries("Config reloads", "Reloads in each interval, by result.",
                     [(f"sum by (result) (increase(fanout_config_reloads_total{{{SEL}}}{RI}))",
                       "{{result}}")], "short"), 8, 8)
    L.add(stat("Since last good reload", "Time since the config last reloaded successfully.",
               f"time() - max(fanout_config_last_reload_success_timestamp_seconds{{{SEL}}})", "s"),
          8, 8)
    return L.panels


def variable(name, label, query, all_value=".*"):
    return {
        "name": name, "label": label, "type": "query", "datasource": DS,
        "query": {"query": query, "refId": f"{name}-query"},
        "definition": query, "refresh": 2, "includeAll": True, "multi": True,
        "allValue": all_value, "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1, "hide": 0,
    }


def dashboard():
    return {
        "__inputs": [{
            "name": "DS_PROMETHEUS", "label": "Prometheus", "description": "",
            "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus",
        }],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
            {"type": "panel", "id": "stat", "name": "Stat", "version": ""},
        ],
        "uid": "fanout-gateway",
        "title": "fanout",
        "description": "fanout API gateway: requests per route, backends, admission, caches and "
                       "batching, reference data, process. Metric names: docs/operations.md.",
        "tags": ["fanout", "gateway"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timepicker": {},
        "timezone": "",
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard",
        }]},
        "links": [],
        "templating": {"list": [
            {"name": "DS_PROMETHEUS", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "regex": "",
             "includeAll": False, "multi": False},
            variable("job", "Job", "label_values(fanout_requests_total, job)"),
            variable("instance", "Instance",
                     'label_values(fanout_requests_total{job=~"$job"}, instance)'),
            variable("route", "Route",
                     'label_values(fanout_requests_total{job=~"$job"}, route)'),
            variable("backend", "Backend",
                     'label_values(fanout_backend_calls_total{job=~"$job"}, backend)'),
        ]},
        "panels": build(),
    }


def main():
    text = json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"
    check = "--check" in sys.argv[1:]
    stale = []
    for path in OUTPUTS:
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        print("not up to date (run python3 deploy/grafana/generate.py): " + ", ".join(stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
