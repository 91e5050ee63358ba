#!/usr/bin/env python3
"""Checks of deploy/k8s without a cluster (ctest: deploy_k8s_manifests).

  check_k8s.py OOMBD REPO_ROOT

For each overlay (single/, fleet/): renders it with `kubectl kustomize` (offline; without
kubectl, with a minimal renderer of the few kustomize fields used here), validates
every built-in resource against the Kubernetes OpenAPI schemas bundled in the PyPI package
kubernetes-validate (strict: unknown fields are errors) and the PodMonitor structurally; runs
the generated ConfigMap's config.yaml through the real `oombd config print`; and checks that
the pieces fit: probes on the plaintext health port the config opens, ports named where they
are used, the volumes, ConfigMap and Secrets mounted where the config reads its files, the
grace period above shutdown_grace_seconds, the GPU limit, the Dockerfile's non-root user.
Every YAML file under deploy/k8s must parse. First, the checkers are shown to reject broken
input, so that a pass means something.

Prints "check_k8s: ok" and exits 0, or lists every problem and exits 1; exits 77 (skip) when
kubernetes-validate is missing.
"""
import copy
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oombd_config import ConfigError, effective_config, port_of  # noqa: E402

try:
    import kubernetes_validate
except ImportError:
    print("check_k8s: skipped: no kubernetes-validate in this Python (scripts/setup.sh installs it)")
    sys.exit(77)

# The oldest Kubernetes with gRPC probes GA (1.27), and the newest the package bundles.
K8S_VERSIONS = ["1.27.0", kubernetes_validate.utils.latest_version()]
# The grace period must cover the drain (shutdown_grace_seconds), the 5 s oombd gives open RPCs
# to finish, and a margin for the checkpoint's last write and process exit.
GRACE_MARGIN_SECONDS = 15
# The Secrets the manifests mount, created outside them (docs/DEPLOY.md), and their keys.
SECRETS = {"oomb-token": {"token"}, "oomb-tls": {"tls.crt", "tls.key", "ca.crt"}, "oomb-postgres": {"url"}}

problems = []


def check(cond, message):
    if not cond:
        problems.append(message)
    return cond


def validate(doc):
    """Schema errors of one built-in resource, for each Kubernetes version (empty: valid)."""
    errors = []
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"Kubernetes {version}: {e.message} at {'.'.join(str(p) for p in e.path)}")
        except kubernetes_validate.SchemaNotFoundError as e:
            errors.append(f"Kubernetes {version}: no schema: {e}")
    return errors


def render_minimal(directory):
    """What `kubectl kustomize` makes of the kustomizations here, for machines without kubectl:
    `resources` (files, and directories with a kustomization.yaml) and `configMapGenerator`
    with `files` (without the name's hash suffix). Anything else is an error, never ignored."""
    with open(os.path.join(directory, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    unsupported = set(k) - {"apiVersion", "kind", "resources", "configMapGenerator"}
    if not check(not unsupported, f"{directory}: the fallback renderer does not do {sorted(unsupported)}: install kubectl"):
        return []
    docs = []
    for r in k.get("resources", []):
        path = os.path.join(directory, r)
        if os.path.isdir(path):
            docs += render_minimal(path)
        else:
            with open(path) as f:
                docs += [d for d in yaml.safe_load_all(f) if d]
    for g in k.get("configMapGenerator", []):
        data = {}
        for name in g["files"]:
            with open(os.path.join(directory, name)) as f:
                data[os.path.basename(name)] = f.read()
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": g["name"]}, "data": data})
    return docs


def render(overlay):
    if shutil.which("kubectl") is None:
        print(f"check_k8s: note: no kubectl; {overlay} rendered by the fallback renderer")
        return render_minimal(overlay)
    r = subprocess.run(["kubectl", "kustomize", overlay], capture_output=True, text=True)
    if not check(r.returncode == 0, f"kubectl kustomize {overlay}: {r.stderr.strip()}"):
        return []
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def container_env(c, pod_name):
    """The container's environment as the kubelet makes it: `value`s with $(VAR) references to
    earlier variables expanded, the pod's name for a fieldRef to metadata.name."""
    env = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), e["value"])
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[e["name"]] = pod_name
    return env


def mount_of(path, mounts):
    """The volume mount holding `path` (the deepest mount path above or at it), or None."""
    best = None
    for m in mounts.values():
        if (path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")) and (
                best is None or len(m["mountPath"]) > len(best["mountPath"])):
            best = m
    return best


def check_podmonitor(pm, pod_labels, container_ports, where):
    check(pm.get("apiVersion") == "monitoring.coreos.com/v1", f"{where}: apiVersion {pm.get('apiVersion')}")
    spec = pm.get("spec", {})
    match = spec.get("selector", {}).get("matchLabels", {})
    check(match and all(pod_labels.get(k) == v for k, v in match.items()),
          f"{where}: selector {match} does not select the pods (labels {pod_labels})")
    endpoints = spec.get("podMetricsEndpoints") or []
    check(len(endpoints) >= 1, f"{where}: no podMetricsEndpoints")
    for ep in endpoints:
        known = {"port", "path", "interval", "scrapeTimeout", "relabelings", "metricRelabelings", "scheme",
                 "honorLabels", "tlsConfig", "bearerTokenSecret", "params"}
        check(set(ep) <= known, f"{where}: unknown podMetricsEndpoints fields {set(ep) - known}")
        check(ep.get("port") == "metrics" and "metrics" in container_ports,
              f"{where}: scrapes port {ep.get('port')!r}, not the container port named metrics")
        check(ep.get("path", "/metrics") == "/metrics", f"{where}: path {ep.get('path')}")
        check(re.fullmatch(r"\d+[smh]", ep.get("interval", "30s")) is not None, f"{where}: interval {ep.get('interval')}")
        jobs = [r.get("replacement") for r in ep.get("relabelings", []) if r.get("targetLabel") == "job"]
        check(jobs == ["oomb"], f"{where}: the job label must be oomb (deploy/prometheus/alerts.yml), got {jobs}")


def check_overlay(name, oombd, repo, dockerfile_uid):
    overlay = os.path.join(repo, "deploy/k8s", name)
    docs = render(overlay)
    if not docs:
        return
    where = f"k8s/{name}"
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        for err in validate(d):
            problems.append(f"{where}: {d['kind']}/{d['metadata']['name']}: {err}")

    kind = "StatefulSet" if name == "single" else "Deployment"
    workloads = by_kind.get(kind, [])
    if not check(len(workloads) == 1, f"{where}: expected one {kind}, got {len(workloads)}"):
        return
    w = workloads[0]
    spec = w["spec"]
    if name == "single":
        check(spec.get("replicas") == 1, f"{where}: a StatefulSet with SQLite must have 1 replica")
    else:
        check(spec.get("replicas", 1) >= 2, f"{where}: the fleet should run several replicas")
    pod = spec["template"]["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    check(all(pod_labels.get(k) == v for k, v in spec["selector"]["matchLabels"].items()),
          f"{where}: the selector does not select the pod template")
    containers = [c for c in pod["containers"] if c["name"] == "oombd"]
    if not check(len(containers) == 1, f"{where}: no container named oombd"):
        return
    c = containers[0]
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}

    # The ConfigMap and the config.yaml in it, through the real binary.
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claim_templates = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    for m in mounts.values():
        check(m["name"] in volumes or m["name"] in claim_templates, f"{where}: mount {m['name']} has no volume")
    args = c.get("args", [])
    config_path = args[args.index("--config") + 1] if "--config" in args else None
    if not check(args[:1] == ["serve"] and config_path, f"{where}: args must be serve --config FILE, got {args}"):
        return
    config_mount = mounts.get(os.path.dirname(config_path))
    cm_volume = volumes.get(config_mount["name"]) if config_mount else None
    if not check(cm_volume is not None and "configMap" in cm_volume,
                 f"{where}: {config_path} is not in a mounted ConfigMap"):
        return
    configmaps = {d["metadata"]["name"]: d for d in by_kind.get("ConfigMap", [])}
    cm = configmaps.get(cm_volume["configMap"]["name"])
    if not check(cm is not None, f"{where}: ConfigMap {cm_volume['configMap']['name']} is not in the overlay"):
        return
    text = cm.get("data", {}).get(os.path.basename(config_path))
    if not check(text is not None, f"{where}: the ConfigMap has no key {os.path.basename(config_path)}"):
        return
    file_config = yaml.safe_load(text)
    store = file_config.get("store")
    if name == "fleet":
        check(isinstance(store, dict) and store.get("backend") == "postgres",
              f"{where}: the fleet needs store.backend: postgres")
    else:
        check(store is None or store.get("backend", "sqlite") == "sqlite", f"{where}: single uses SQLite")
    # The effective configuration in two pods of the workload: the file, then the container's
    # OOMB_SECTION__KEY variables.
    configs = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "config.yaml")
        with open(path, "w") as f:
            f.write(text)  # as shipped, so that oombd's file:line errors point into it
        for pod_name in (w["metadata"]["name"] + "-0", w["metadata"]["name"] + "-1"):
            env = container_env(c, pod_name)
            check(not any("$(" in v for v in env.values()), f"{where}: an env $(VAR) names no earlier variable: {env}")
            try:
                configs.append(effective_config(oombd, path, {k: v for k, v in env.items() if k.startswith("OOMB_")}))
            except ConfigError as e:
                problems.append(f"{where}: config.yaml with the container's environment refused by oombd: {e}")
                return
    config = configs[0]
    server = config["server"]

    # Ports: the config opens what the pod declares, on every address (the kubelet and
    # Prometheus connect to the pod's IP).
    for key, port_name in (("listen", "grpc"), ("health_listen", "health")):
        value = server.get(key, "")
        check(value.startswith("0.0.0.0:") and port_of(value) == ports.get(port_name),
              f"{where}: server.{key} {value!r} is not 0.0.0.0 on the container port {port_name} ({ports.get(port_name)})")
    check(config["metrics"]["listen"] == f"0.0.0.0:{ports.get('metrics')}",
          f"{where}: metrics.listen {config['metrics']['listen']!r} must be 0.0.0.0 on the port named metrics")
    check(config["http"]["listen"] == f"0.0.0.0:{ports.get('http')}",
          f"{where}: http.listen {config['http']['listen']!r} must be 0.0.0.0 on the port named http")

    # Probes: gRPC on the plaintext health port.
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        p = c.get(probe)
        if check(p is not None and "grpc" in p, f"{where}: {probe} must be a grpc probe"):
            check(p["grpc"].get("port") == ports.get("health"),
                  f"{where}: {probe} probes port {p['grpc'].get('port')}, not health ({ports.get('health')})")
            check(p["grpc"].get("service", "") == "", f"{where}: {probe} names a service oombd does not register")

    # Shutdown: the kubelet's SIGKILL comes after the drain.
    grace = pod.get("terminationGracePeriodSeconds", 30)
    need = int(server["shutdown_grace_seconds"]) + 5 + GRACE_MARGIN_SECONDS
    check(grace >= need, f"{where}: terminationGracePeriodSeconds {grace} < shutdown_grace_seconds + 5 + "
          f"{GRACE_MARGIN_SECONDS} = {need}")

    # GPU, user, file system.
    limits = c.get("resources", {}).get("limits", {})
    check(int(limits.get("nvidia.com/gpu", 0)) >= 1, f"{where}: no nvidia.com/gpu in resources.limits")
    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True and (psc.get("runAsUser"), psc.get("runAsGroup")) == dockerfile_uid,
          f"{where}: must run as the Dockerfile's non-root user (uid, gid) {dockerfile_uid}")
    check(csc.get("allowPrivilegeEscalation") is False and csc.get("capabilities", {}).get("drop") == ["ALL"],
          f"{where}: the container must drop every capability and privilege escalation")
    if csc.get("readOnlyRootFilesystem"):
        check("/tmp" in mounts and not mounts["/tmp"].get("readOnly"), f"{where}: read-only root without /tmp")

    # The data dir (store, checkpoints, port files) is a directory on a writable volume, below
    # its root: oombd makes it 0700, which it cannot do to a volume root owned by root. single:
    # the StatefulSet's claim; fleet: one directory per pod on a shared ReadWriteMany claim, so
    # that every replica sees every job's checkpoints at the path recorded in the job.
    data_dir = server["data_dir"]
    data = mount_of(data_dir, mounts)
    if check(data is not None and not data.get("readOnly"), f"{where}: data_dir {data_dir} is not on a writable volume"):
        check(data_dir.rstrip("/") != data["mountPath"].rstrip("/"),
              f"{where}: data_dir {data_dir} is a volume's root (owned by root: oombd cannot make it 0700)")
        if name == "single":
            check(data["name"] in claim_templates, f"{where}: data_dir must be on the StatefulSet's volumeClaimTemplates")
        else:
            claim = volumes.get(data["name"], {}).get("persistentVolumeClaim", {}).get("claimName")
            pvcs = {d["metadata"]["name"]: d for d in by_kind.get("PersistentVolumeClaim", [])}
            check(claim in pvcs and "ReadWriteMany" in pvcs[claim]["spec"]["accessModes"],
                  f"{where}: data_dir (checkpoints) must be on a shared ReadWriteMany claim")
            check(configs[0]["server"]["data_dir"] != configs[1]["server"]["data_dir"],
                  f"{where}: every replica needs its own data_dir on the shared volume (port files)")
    for root in config["paths"]["allowed_roots"].split(","):
        check(root.strip() in mounts, f"{where}: paths.allowed_roots {root} is not a mounted volume")
    for v in volumes.values():
        claim = v.get("persistentVolumeClaim", {}).get("claimName")
        if claim:
            check(claim in {d["metadata"]["name"] for d in by_kind.get("PersistentVolumeClaim", [])},
                  f"{where}: volume {v['name']} claims {claim}, which the overlay does not define")

    # Secrets: every file the config reads is a key of a mounted Secret; every Secret mounted
    # is one docs/DEPLOY.md tells how to create, with its keys.
    secret_files = {}
    for mount_path, m in mounts.items():
        s = volumes.get(m["name"], {}).get("secret")
        if s is None:
            continue
        check(s["secretName"] in SECRETS, f"{where}: Secret {s['secretName']} is not one of {sorted(SECRETS)}")
        for item in s.get("items", []):
            check(item["key"] in SECRETS.get(s["secretName"], set()), f"{where}: {s['secretName']} has no key {item['key']}")
            secret_files[os.path.join(mount_path, item["path"])] = s["secretName"]
    files = [config["auth"]["token_file"], config["tls"]["cert_file"], config["tls"]["key_file"],
             config["tls"]["client_ca_file"]]
    if name == "fleet":
        files.append(config["store"]["postgres_url_file"])
    for f in files:
        if f:
            check(f in secret_files, f"{where}: {f} (read by the config) is not a mounted Secret key")
    check(config["auth"]["token_file"] and config["tls"]["cert_file"],
          f"{where}: in a cluster the job API needs a token and TLS")

    # Services: target ports exist, selectors select the pods; the StatefulSet's service exists.
    services = {d["metadata"]["name"]: d for d in by_kind.get("Service", [])}
    for s in services.values():
        sel = s["spec"].get("selector", {})
        check(sel and all(pod_labels.get(k) == v for k, v in sel.items()),
              f"{where}: Service {s['metadata']['name']} does not select the pods")
        for p in s["spec"]["ports"]:
            check(p.get("targetPort") in ports, f"{where}: Service {s['metadata']['name']} targets {p.get('targetPort')}")
        check("health" not in [p.get("targetPort") for p in s["spec"]["ports"]],
              f"{where}: the plaintext health port must not be exposed by a Service")
    if name == "single":
        gov = services.get(spec.get("serviceName"))
        check(gov is not None and gov["spec"].get("clusterIP") == "None",
              f"{where}: serviceName {spec.get('serviceName')} must be a headless Service of the overlay")

    monitors = by_kind.get("PodMonitor", [])
    check(len(monitors) == 1, f"{where}: expected one PodMonitor")
    for pm in monitors:
        check_podmonitor(pm, pod_labels, ports, f"{where}: PodMonitor")


def self_test(oombd, repo):
    """The checkers reject what they must: a schema error, a PodMonitor that misses, a bad key."""
    docs = render(os.path.join(repo, "deploy/k8s/single"))
    sts = copy.deepcopy(next(d for d in docs if d["kind"] == "StatefulSet"))
    c = sts["spec"]["template"]["spec"]["containers"][0]
    c["livenessProbe"]["grpc"]["port"] = "health"  # gRPC probes take a number, not a port name
    c["securityContext"]["runAsNonroot"] = True    # misspelled field
    check(len(validate(sts)) > 0, "self-test: the schema check accepted a broken StatefulSet")
    before = len(problems)
    check_podmonitor({"apiVersion": "monitoring.coreos.com/v1", "spec": {"selector": {"matchLabels": {"app": "x"}},
                      "podMetricsEndpoints": [{"port": "http"}]}}, {"app": "y"}, {"metrics": 7071}, "self-test")
    caught = len(problems) - before
    del problems[before:]
    check(caught >= 3, f"self-test: the PodMonitor check caught {caught} of 3 problems")
    with tempfile.TemporaryDirectory() as tmp:
        bad = os.path.join(tmp, "bad.yaml")
        with open(bad, "w") as f:
            f.write("server:\n  helth_listen: 0.0.0.0:7073\n")
        try:
            effective_config(oombd, bad)
            problems.append("self-test: oombd accepted an unknown configuration key")
        except ConfigError as e:
            check("server.helth_listen: unknown key" in str(e), f"self-test: unexpected oombd error: {e}")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    oombd, repo = sys.argv[1], sys.argv[2]
    for path in sorted(glob.glob(os.path.join(repo, "deploy/k8s/**/*.yaml"), recursive=True)):
        try:
            with open(path) as f:
                list(yaml.safe_load_all(f))
        except yaml.YAMLError as e:
            problems.append(f"{os.path.relpath(path, repo)}: {e}")
    with open(os.path.join(repo, "Dockerfile")) as f:
        dockerfile = f.read()
    uid, gid = re.search(r"useradd [^\n]*--uid (\d+)", dockerfile), re.search(r"groupadd [^\n]*--gid (\d+)", dockerfile)
    check(uid and gid, "Dockerfile: no useradd --uid or groupadd --gid")
    dockerfile_uid = (int(uid.group(1)), int(gid.group(1))) if uid and gid else None
    self_test(oombd, repo)
    for overlay in ("single", "fleet"):
        check_overlay(overlay, oombd, repo, dockerfile_uid)
    with open(os.path.join(repo, "docs/DEPLOY.md")) as f:
        doc = f.read()
    for secret, keys in SECRETS.items():
        check(secret in doc and all(k in doc for k in keys), f"docs/DEPLOY.md: how to create {secret} ({sorted(keys)})")
    if problems:
        for p in problems:
            print("check_k8s: " + p)
        print(f"check_k8s: {len(problems)} problem(s)")
        sys.exit(1)
    print("check_k8s: ok")


if __name__ == "__main__":
    main()
