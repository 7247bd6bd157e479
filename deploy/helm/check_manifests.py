#!/usr/bin/env python3
"""Check the manifests `helm template` rendered from deploy/helm/fanout (used by scripts/check-deploy).

Two kinds of checks:
- schemas: every built-in resource is validated strictly (unknown fields are errors) by
  `kubernetes-validate` against the Kubernetes version given; the ServiceMonitor is a CRD without
  a schema there, so its fields are checked here;
- the chart's promises: probes on the admin port (/readyz, /healthz) and that port in the config,
  the preStop sleep equal to the drain delay and a grace period longer than preStop + drain delay
  + shutdown grace, a config checksum on the pod template, the Redis URL as FANOUT_REDIS_URL, a
  non-root, read-only, capability-free container, HPA on CPU, a PDB and Service that select the
  pods, the dashboard ConfigMap holding deploy/grafana/fanout.json.

    check_manifests.py --validator PATH --k8s 1.32.0 --kinds Deployment,Service,... \
        [--redis none|url|secret] [--dashboard deploy/grafana/fanout.json] [--tls SECRET] \
        [--config-out FILE] rendered.yaml
    check_manifests.py --validator PATH --k8s 1.32.0 --self-test rendered.yaml

--self-test breaks a good rendering in several ways and exits 1 unless every breakage is caught.
Runs with the kubernetes-validate virtualenv's Python (it has PyYAML).
"""

import argparse
import copy
import json
import re
import subprocess
import sys
import tempfile

import yaml

DURATION = re.compile(r"^([0-9]+(ms|s|m|h))+$")


def seconds(d):
    total = 0.0
    for n, unit in re.findall(r"([0-9]+)(ms|s|m|h)", d):
        total += int(n) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


def one(docs, kind, problems):
    found = [d for d in docs if d.get("kind") == kind]
    if len(found) != 1:
        problems.append(f"expected one {kind}, found {len(found)}")
        return None
    return found[0]


def validate_schemas(docs, validator, k8s):
    """kubernetes-validate --strict on every non-CRD document; problems as strings."""
    builtin = [d for d in docs if d.get("kind") != "ServiceMonitor"]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump_all(builtin, f, sort_keys=False)
        f.flush()
        run = subprocess.run([validator, "-k", k8s, "--strict", "--quiet", f.name],
                             capture_output=True, text=True)
    out = (run.stdout + run.stderr).strip()
    problems = []
    if run.returncode != 0:
        problems.append("kubernetes-validate --strict failed:\n" + out)
    elif "Couldn't find schema" in out:
        problems.append("a resource was not validated (no schema):\n" + out)
    return problems


def container_of(dep, problems):
    cs = dep["spec"]["template"]["spec"].get("containers", [])
    if len(cs) != 1:
        problems.append(f"expected one container, found {len(cs)}")
        return None
    return cs[0]


def port_of(c, name):
    for p in c.get("ports", []):
        if p.get("name") == name:
            return p.get("containerPort")
    return None


def listen_port(addr):
    m = re.match(r"^.*:([0-9]+)$", str(addr or ""))
    return int(m.group(1)) if m else None


def check_probes(c, cfg, problems):
    admin = port_of(c, "admin")
    if admin is None:
        problems.append("the container has no `admin` port")
    want = {"readinessProbe": "/readyz", "livenessProbe": "/healthz", "startupProbe": "/healthz"}
    for probe, path in want.items():
        get = (c.get(probe) or {}).get("httpGet") or {}
        if get.get("path") != path or get.get("port") not in ("admin", admin):
            problems.append(f"{probe} must GET {path} on the admin port, got {get}")
    if listen_port((cfg.get("admin") or {}).get("listen")) != admin:
        problems.append(f"config admin.listen {cfg.get('admin')} is not the admin port {admin}")
    if listen_port(cfg.get("listen")) != port_of(c, "http"):
        problems.append(f"config listen {cfg.get('listen')} is not the http port")


def check_shutdown(pod, c, cfg, problems):
    server = cfg.get("server") or {}
    drain = seconds(str(server.get("drain_delay", "0s")))
    grace = seconds(str(server.get("shutdown_grace", "10s")))
    pre = (c.get("lifecycle") or {}).get("preStop") or {}
    if "sleep" in pre:
        pre_s = pre["sleep"].get("seconds", 0)
    elif "exec" in pre:
        cmd = pre["exec"].get("command", [])
        pre_s = int(cmd[1]) if len(cmd) == 2 and cmd[0] == "sleep" else -1
    else:
        pre_s = 0
    if drain > 0 and pre_s != drain:
        problems.append(f"preStop sleeps {pre_s}s, the drain delay is {drain}s")
    spread = seconds(str(server.get("drain_spread", "0s")))
    if spread and spread >= grace:
        problems.append(f"server.drain_spread {spread}s is not shorter than the shutdown grace "
                        f"{grace}s")
    tgp = pod.get("terminationGracePeriodSeconds", 30)
    if not tgp > pre_s + drain + grace:
        problems.append(f"terminationGracePeriodSeconds {tgp} <= preStop {pre_s} + drain "
                        f"{drain} + shutdown grace {grace}")


def check_security(pod, c, problems):
    psc, sc = pod.get("securityContext") or {}, c.get("securityContext") or {}
    if not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
        problems.append("runAsNonRoot is not set")
    if (sc.get("runAsUser", psc.get("runAsUser")) or 0) == 0:
        problems.append("runs as uid 0")
    if sc.get("readOnlyRootFilesystem") is not True:
        problems.append("readOnlyRootFilesystem is not true")
    if sc.get("allowPrivilegeEscalation") is not False:
        problems.append("allowPrivilegeEscalation is not false")
    if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
        problems.append("capabilities.drop does not contain ALL")
    res = c.get("resources") or {}
    for part in ("requests", "limits"):
        if not (res.get(part) or {}).get("memory"):
            problems.append(f"resources.{part}.memory is not set")


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_service(docs, pod_labels, c, problems):
    svc = one(docs, "Service", problems)
    if svc is None:
        return None
    if not selects(svc["spec"].get("selector"), pod_labels):
        problems.append("the Service does not select the pods")
    names = {p.get("name"): p for p in svc["spec"].get("ports", [])}
    for n in ("http", "admin"):
        p = names.get(n)
        if p is None or p.get("targetPort") not in (n, port_of(c, n)):
            problems.append(f"the Service has no `{n}` port targeting the container's")
    return svc


def check_servicemonitor(sm, svc, problems):
    """The ServiceMonitor's fields (a CRD: no schema in kubernetes-validate)."""
    if sm.get("apiVersion") != "monitoring.coreos.com/v1":
        problems.append(f"ServiceMonitor apiVersion {sm.get('apiVersion')}")
    spec = sm.get("spec") or {}
    allowed = {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels",
               "podTargetLabels", "sampleLimit", "attachMetadata"}
    extra = set(spec) - allowed
    if extra:
        problems.append(f"ServiceMonitor spec has unknown fields {sorted(extra)}")
    sel = (spec.get("selector") or {}).get("matchLabels") or {}
    if svc is None or not selects(sel, svc["metadata"].get("labels") or {}):
        problems.append("the ServiceMonitor's selector does not match the Service's labels")
    ns = (spec.get("namespaceSelector") or {}).get("matchNames")
    if ns is not None and svc is not None and svc["metadata"].get("namespace") not in (None, *ns):
        problems.append(f"namespaceSelector {ns} misses the Service's namespace")
    eps = spec.get("endpoints") or []
    if not eps:
        problems.append("the ServiceMonitor has no endpoints")
    svc_ports = {p.get("name") for p in (svc or {}).get("spec", {}).get("ports", [])}
    ep_allowed = {"port", "path", "scheme", "interval", "scrapeTimeout", "relabelings",
                  "metricRelabelings", "honorLabels", "honorTimestamps", "params"}
    for ep in eps:
        if set(ep) - ep_allowed:
            problems.append(f"endpoint has unknown fields {sorted(set(ep) - ep_allowed)}")
        if ep.get("port") != "admin" or "admin" not in svc_ports:
            problems.append(f"endpoint port {ep.get('port')!r} is not the Service's admin port")
        if ep.get("path", "/metrics") != "/metrics":
            problems.append(f"endpoint path {ep.get('path')!r} is not /metrics")
        if ep.get("scheme", "http") not in ("http", "https"):
            problems.append(f"endpoint scheme {ep.get('scheme')!r}")
        for k in ("interval", "scrapeTimeout"):
            if k in ep and not DURATION.match(str(ep[k])):
                problems.append(f"endpoint {k} {ep[k]!r} is not a Prometheus duration")
        if "interval" in ep and "scrapeTimeout" in ep and DURATION.match(str(ep["interval"])) \
                and DURATION.match(str(ep["scrapeTimeout"])) \
                and seconds(ep["scrapeTimeout"]) > seconds(ep["interval"]):
            problems.append("scrapeTimeout is longer than interval")


def check_redis(c, redis, problems):
    env = {e.get("name"): e for e in c.get("env") or []}
    e = env.get("FANOUT_REDIS_URL")
    if redis == "none" and e is not None:
        problems.append("FANOUT_REDIS_URL is set without redis values")
    if redis == "url" and not (e and e.get("value")):
        problems.append("FANOUT_REDIS_URL is not set from redis.url")
    if redis == "secret" and not (e and ((e.get("valueFrom") or {}).get("secretKeyRef"))):
        problems.append("FANOUT_REDIS_URL does not come from the Secret")


def check_tls(pod, c, cfg, secret, problems):
    """`--tls SECRET`: the Secret mounted whole (a subPath never sees a renewal) and read-only at
    /etc/fanout-tls, and the config's certificate pair pointing into it; without: no TLS."""
    tls = cfg.get("tls")
    if not secret:
        if tls is not None:
            problems.append("the config has `tls` without tls values")
        return
    vols = [v for v in pod.get("volumes", []) if (v.get("secret") or {}).get("secretName") == secret]
    if len(vols) != 1:
        problems.append(f"the TLS Secret {secret} is not one volume of the pod")
        return
    mounts = [m for m in c.get("volumeMounts", []) if m.get("name") == vols[0]["name"]]
    if len(mounts) != 1 or mounts[0].get("mountPath") != "/etc/fanout-tls":
        problems.append("the TLS Secret is not mounted at /etc/fanout-tls")
    elif "subPath" in mounts[0] or not mounts[0].get("readOnly"):
        problems.append("the TLS Secret is mounted with a subPath or writable")
    pairs = (tls or {}).get("certificates") or []
    want = {"cert_file": "/etc/fanout-tls/tls.crt", "key_file": "/etc/fanout-tls/tls.key"}
    if pairs != [want]:
        problems.append(f"the config's tls.certificates is {pairs!r}, not the mounted Secret's pair")


def check_dashboard(docs, dashboard, problems):
    cms = [d for d in docs if d.get("kind") == "ConfigMap"
           and (d["metadata"].get("labels") or {}).get("grafana_dashboard") == "1"]
    if dashboard is None:
        if cms:
            problems.append("a dashboard ConfigMap was rendered, none was expected")
        return
    if len(cms) != 1:
        problems.append(f"expected one ConfigMap labelled grafana_dashboard: \"1\", found {len(cms)}")
        return
    try:
        got = json.loads(cms[0]["data"]["fanout.json"])
    except (KeyError, ValueError) as e:
        problems.append(f"the dashboard ConfigMap has no valid fanout.json: {e}")
        return
    with open(dashboard, encoding="utf-8") as f:
        if got != json.load(f):
            problems.append(f"the dashboard ConfigMap differs from {dashboard}")


def check(docs, args):
    """Every problem of a rendering (schemas and the chart's promises)."""
    problems = []
    kinds = sorted(d.get("kind", "?") for d in docs)
    if args.kinds is not None and kinds != sorted(args.kinds.split(",")):
        problems.append(f"rendered kinds {kinds}, expected {sorted(args.kinds.split(','))}")
    problems += validate_schemas(docs, args.validator, args.k8s)
    dep = one(docs, "Deployment", problems)
    if dep is None:
        return problems, None
    pod = dep["spec"]["template"]["spec"]
    pod_labels = dep["spec"]["template"]["metadata"].get("labels") or {}
    c = container_of(dep, problems)
    if c is None:
        return problems, None
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    cm_name = ((vols.get("config") or {}).get("configMap") or {}).get("name")
    cms = [d for d in docs if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == cm_name]
    if (mounts.get("config") or {}).get("mountPath") != "/etc/fanout" or len(cms) != 1:
        problems.append("the config ConfigMap is not mounted at /etc/fanout")
        return problems, None
    text = cms[0]["data"].get("fanout.yaml", "")
    cfg = yaml.safe_load(text) or {}
    checksum = (dep["spec"]["template"]["metadata"].get("annotations") or {}).get("checksum/config")
    if not re.fullmatch(r"[0-9a-f]{64}", str(checksum)):
        problems.append(f"pod template annotation checksum/config is {checksum!r}")
    check_probes(c, cfg, problems)
    check_shutdown(pod, c, cfg, problems)
    check_security(pod, c, problems)
    svc = check_service(docs, pod_labels, c, problems)
    for sm in (d for d in docs if d.get("kind") == "ServiceMonitor"):
        check_servicemonitor(sm, svc, problems)
    hpa = [d for d in docs if d.get("kind") == "HorizontalPodAutoscaler"]
    for h in hpa:
        ref = h["spec"].get("scaleTargetRef") or {}
        cpu = [m for m in h["spec"].get("metrics", [])
               if (m.get("resource") or {}).get("name") == "cpu"]
        if h.get("apiVersion") != "autoscaling/v2" or ref.get("name") != dep["metadata"]["name"] \
                or not cpu:
            problems.append("the HPA is not autoscaling/v2 on the Deployment's CPU")
        if "replicas" in dep["spec"]:
            problems.append("the Deployment sets replicas although an HPA owns them")
    for pdb in (d for d in docs if d.get("kind") == "PodDisruptionBudget"):
        if not selects((pdb["spec"].get("selector") or {}).get("matchLabels"), pod_labels):
            problems.append("the PodDisruptionBudget does not select the pods")
    check_redis(c, args.redis, problems)
    check_tls(pod, c, cfg, args.tls, problems)
    check_dashboard(docs, args.dashboard, problems)
    return problems, text


def self_test(docs, args):
    """Each breakage of a good rendering must be reported; returns the ones that were not."""
    def deployment(ds):
        return next(d for d in ds if d.get("kind") == "Deployment")

    def container(ds):
        return deployment(ds)["spec"]["template"]["spec"]["containers"][0]

    def sm(ds):
        return next(d for d in ds if d.get("kind") == "ServiceMonitor")

    def set_(path, value):
        def f(ds):
            obj = ds
            for k in path[:-1]:
                obj = k(obj) if callable(k) else obj[k]
            obj[path[-1]] = value
        return f

    breakages = {
        "replicas is a string (schema)": set_([deployment, "spec", "replicas"], "two"),
        "unknown container field (strict schema)": set_([container, "bogus"], 1),
        "readiness probe on /healthz": set_([container, "readinessProbe", "httpGet", "path"], "/healthz"),
        "liveness probe on the http port": set_([container, "livenessProbe", "httpGet", "port"], "http"),
        "preStop shorter than the drain delay": set_([container, "lifecycle", "preStop"],
                                                     {"exec": {"command": ["sleep", "1"]}}),
        "grace period too short": set_([deployment, "spec", "template", "spec",
                                        "terminationGracePeriodSeconds"], 3),
        "writable root filesystem": set_([container, "securityContext", "readOnlyRootFilesystem"], False),
        "capabilities kept": set_([container, "securityContext", "capabilities"], {"drop": []}),
        "no config checksum": set_([deployment, "spec", "template", "metadata", "annotations"], {}),
    }
    if any(d.get("kind") == "ServiceMonitor" for d in docs):
        breakages.update({
            "ServiceMonitor scrapes a port the Service lacks": lambda ds: sm(ds)["spec"]["endpoints"][0].update(port="metrics"),
            "ServiceMonitor selector matches nothing": set_([sm, "spec", "selector"], {"matchLabels": {"app": "x"}}),
            "ServiceMonitor interval is not a duration": lambda ds: sm(ds)["spec"]["endpoints"][0].update(interval="often"),
            "ServiceMonitor unknown field": lambda ds: sm(ds)["spec"].update(endpoint=[]),
        })
    base, _ = check(docs, args)
    if base:
        return ["the unbroken rendering already has problems: " + "; ".join(base)]
    missed = []
    for name, breakage in breakages.items():
        broken = copy.deepcopy(docs)
        breakage(broken)
        problems, _ = check(broken, args)
        print(f"  {'caught' if problems else 'MISSED'}: {name}" +
              (f" ({' '.join(problems[0].split())[:160]})" if problems else ""))
        if not problems:
            missed.append(name)
    return missed


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--validator", required=True, help="the kubernetes-validate executable")
    p.add_argument("--k8s", required=True, help="Kubernetes version to validate against")
    p.add_argument("--kinds", help="the rendered kinds, comma-separated (repeat for several)")
    p.add_argument("--redis", choices=["none", "url", "secret"], default="none")
    p.add_argument("--dashboard", help="the dashboard JSON the ConfigMap must hold")
    p.add_argument("--tls", help="the TLS Secret the pod must mount (tls.secretName)")
    p.add_argument("--config-out", help="write the rendered fanout config here")
    p.add_argument("--self-test", action="store_true")
    p.add_argument("rendered")
    args = p.parse_args()
    with open(args.rendered, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    if args.self_test:
        missed = self_test(docs, args)
        if missed:
            print("not caught: " + ", ".join(missed), file=sys.stderr)
            return 1
        return 0
    problems, config = check(docs, args)
    if problems:
        print(f"{args.rendered}:", file=sys.stderr)
        for pr in problems:
            print("  - " + pr, file=sys.stderr)
        return 1
    if args.config_out and config is not None:
        with open(args.config_out, "w", encoding="utf-8") as f:
            f.write(config)
    print(f"  ok: {len(docs)} resources ({', '.join(sorted(d['kind'] for d in docs))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
