"""deploy/kubernetes/: every object valid against the Kubernetes schemas (base and rendered overlay),
the settings, probes, security and durability the service relies on, and the generated objects
equal to their sources (dashboards/alerts/bleedwatch.yml, dashboards/*.json).

Core kinds are checked with kubernetes-validate (offline schemas, strict: unknown fields fail).
ServiceMonitor and PrometheusRule are CRDs those schemas lack: a structural check of our own
covers the fields the Prometheus Operator needs. The overlay is rendered by tests/kubernetes_render.py,
and compared with ``kubectl kustomize`` where kubectl is installed."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import yaml

from service.config import Settings
from tests.kubernetes_render import Obj, containers, load, render

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "deploy" / "kubernetes"
BASE = KUBE / "base"
OVERLAY = KUBE / "overlays" / "example"
KUBERNETES_VERSION = "1.30.0"  # the oldest minor still supported upstream when this was written
CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}
SETTINGS = {f"BLEEDWATCH_{name.upper()}" for name in Settings.model_fields}
SECRET_NAMES = ("PASSWORD", "SECRET", "DATABASE_URL", "TOKEN", "REDISCLI_AUTH")

TREES = {"base": BASE, "overlay": OVERLAY}
trees = pytest.mark.parametrize("tree", list(TREES))


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_kubernetes", ROOT / "scripts" / "generate_kubernetes.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def objects(tree: str) -> list[Obj]:
    return render(TREES[tree])


def one(objs: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)}"
    return found[0]


def container(objs: list[Obj], kind: str, name: str) -> Obj:
    pod = one(objs, kind, name)["spec"]["template"]["spec"]
    assert len(pod["containers"]) == 1
    c: Obj = pod["containers"][0]
    return c


def env(c: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


# --- schemas ------------------------------------------------------------------------------------


def _structural(obj: Obj) -> None:
    """The Prometheus Operator's required fields, since kubernetes-validate has no CRD schemas."""
    assert set(obj) <= {"apiVersion", "kind", "metadata", "spec"}, obj["kind"]
    assert obj["metadata"]["name"]
    spec = obj["spec"]
    if obj["kind"] == "ServiceMonitor":
        assert spec["selector"]["matchLabels"]
        assert spec["endpoints"]
        for endpoint in spec["endpoints"]:
            assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout"}, endpoint
            assert endpoint["port"]
            assert endpoint["path"].startswith("/")
    else:
        assert spec["groups"]
        for group in spec["groups"]:
            assert set(group) <= {"name", "interval", "rules"}, group["name"]
            for rule in group["rules"]:
                assert ("alert" in rule) != ("record" in rule), rule
                assert isinstance(rule["expr"], str)
                assert set(rule) <= {"alert", "record", "expr", "for", "labels", "annotations"}, rule
                for value in [*rule.get("labels", {}).values(), *rule.get("annotations", {}).values()]:
                    assert isinstance(value, str), rule  # the CRD types them as strings


@trees
def test_every_object_is_valid_for_kubernetes(tree: str) -> None:
    objs = objects(tree)
    kinds = {(o["apiVersion"], o["kind"]) for o in objs}
    assert kinds >= CRDS
    validated = 0
    for obj in objs:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if (obj["apiVersion"], obj["kind"]) in CRDS:
            _structural(obj)
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{tree}: {where}: {exc.message} at {'/'.join(map(str, exc.absolute_path))}")
        validated += 1
    assert validated >= 12, validated


def test_the_overlay_renders_as_kustomize_does() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: the overlay is validated as tests/kubernetes_render.py renders it")
    result = subprocess.run([kubectl, "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr

    def key(o: Obj) -> tuple[str, str]:
        return (o["kind"], o["metadata"]["name"])

    theirs = sorted((d for d in yaml.safe_load_all(result.stdout) if d), key=key)
    assert sorted(objects("overlay"), key=key) == theirs


# --- the service's contract ---------------------------------------------------------------------


@trees
def test_every_bleedwatch_setting_is_one_config_py_reads(tree: str) -> None:
    objs = objects(tree)
    names = set(one(objs, "ConfigMap", "bleedwatch")["data"])
    for c in containers(objs):
        names |= set(env(c))
    used = {n for n in names if n.startswith("BLEEDWATCH_")}
    assert used - SETTINGS == set(), "not in service/config.py"
    assert "BLEEDWATCH_ALERT_LINKS_URL" in used


def test_api_and_workers_run_apart_with_probes_on_what_they_serve() -> None:
    from service.app import create_app
    from service.work import create_worker_app

    objs = objects("base")
    api, worker = container(objs, "Deployment", "bleedwatch-api"), container(objs, "Deployment", "bleedwatch-worker")
    assert api["args"] == ["serve"]
    assert worker["args"] == ["work"]
    assert env(api)["BLEEDWATCH_INGEST_WORKERS"] == "0"
    assert int(env(worker)["BLEEDWATCH_INGEST_WORKERS"]) >= 1
    settings = Settings(redis_url="redis://127.0.0.1:6379/0", database_url="postgresql://x@127.0.0.1/x")
    apps = {
        "api": (api, create_app(settings), "BLEEDWATCH_PORT"),
        "worker": (worker, create_worker_app(settings), "BLEEDWATCH_WORK_PORT"),
    }
    for role, (c, app, port_setting) in apps.items():
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert list(ports.values()) == [int(env(c)[port_setting])], role
        served = {getattr(route, "path", None) for route in app.routes}
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", role
        assert c["startupProbe"]["httpGet"]["path"] == "/healthz", role
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", role
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            assert c[probe]["httpGet"]["path"] in served, (role, probe)
            assert c[probe]["httpGet"]["port"] in ports, (role, probe)


def test_the_migration_job_migrates_and_runs_first() -> None:
    objs = objects("base")
    job = one(objs, "Job", "bleedwatch-migrate")
    assert container(objs, "Job", "bleedwatch-migrate")["args"] == ["migrate"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert job["metadata"]["labels"]["app.kubernetes.io/component"] == "migrate"  # kubectl apply -l selects it
    assert job["metadata"]["annotations"]["argocd.argoproj.io/hook"] == "PreSync"
    assert "bleedwatch-migrate" in (ROOT / "docs" / "kubernetes.md").read_text()


@trees
def test_pods_run_non_root_read_only_without_capabilities_with_requests(tree: str) -> None:
    objs = objects(tree)
    pods = [o for o in objs if "template" in o.get("spec", {})]
    assert len(pods) == 4
    for obj in pods:
        pod = obj["spec"]["template"]["spec"]
        where = obj["metadata"]["name"]
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
        assert pod["automountServiceAccountToken"] is False, where
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), where
            assert "memory" in c["resources"]["limits"], where
        if obj["metadata"]["name"].startswith("bleedwatch-redis"):
            continue
        # The app's only writable place: /tmp (metrics files of PROMETHEUS_MULTIPROC_DIR, temp files).
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for c in pod["containers"] for m in c["volumeMounts"]}
        assert "emptyDir" in volumes[mounts["/tmp"]], where
        for c in pod["containers"]:
            # prometheus-client writes there from the first import: the directory must be a volume of its own.
            directory = env(c).get("PROMETHEUS_MULTIPROC_DIR")
            if directory is not None:
                assert "emptyDir" in volumes[mounts[directory]], where


@trees
def test_secrets_are_referenced_never_written(tree: str) -> None:
    objs = objects(tree)
    assert not [o for o in objs if o["kind"] == "Secret"]
    config = one(objs, "ConfigMap", "bleedwatch")["data"]
    assert not [k for k in config if any(s in k for s in SECRET_NAMES)]
    for c in containers(objs):
        for e in c.get("env", []):
            if any(s in e["name"] for s in SECRET_NAMES):
                assert "secretKeyRef" in e.get("valueFrom", {}), e["name"]
            value = e.get("value", "")
            if "@" in value:  # a URL with credentials: only a reference to one
                assert ":$(REDIS_PASSWORD)@" in value, e["name"]


@trees
def test_pod_disruption_budgets_cover_api_and_workers(tree: str) -> None:
    objs = objects(tree)
    for name in ("bleedwatch-api", "bleedwatch-worker"):
        pdb = one(objs, "PodDisruptionBudget", name)
        template = one(objs, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= template.items()


def test_redis_keeps_what_was_answered_202() -> None:
    objs = objects("base")
    redis = container(objs, "StatefulSet", "bleedwatch-redis")
    args = redis["args"]
    options = dict(zip(args[1::2], args[2::2], strict=True))
    assert options["--appendonly"] == "yes"
    assert options["--appendfsync"] == "everysec"
    assert options["--maxmemory-policy"] == "noeviction"
    assert options["--maxmemory"] == "$(REDIS_MAXMEMORY)"
    assert options["--requirepass"] == "$(REDIS_PASSWORD)"
    assert env(redis)["REDIS_PASSWORD"]["secretKeyRef"]["key"] == "redis-password"
    mounts = {m["mountPath"] for m in redis["volumeMounts"]}
    assert options["--dir"] in mounts
    claim = one(objs, "StatefulSet", "bleedwatch-redis")["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "data"


def test_the_service_monitor_scrapes_api_and_workers_as_job_bleedwatch() -> None:
    objs = objects("base")
    monitor = one(objs, "ServiceMonitor", "bleedwatch")
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [o for o in objs if o["kind"] == "Service" and selector.items() <= o["metadata"]["labels"].items()]
    assert {s["metadata"]["name"] for s in services} == {"bleedwatch", "bleedwatch-worker"}
    ports = {p["name"] for s in services for p in s["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == ports
    # The job label is the services' app.kubernetes.io/name: "bleedwatch", as up{job="bleedwatch"} expects.
    assert {s["metadata"]["labels"][monitor["spec"]["jobLabel"]] for s in services} == {"bleedwatch"}


# --- generated from one source ------------------------------------------------------------------


def test_generated_objects_are_up_to_date() -> None:
    generator = _generator()
    for path, text in generator.outputs().items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is stale: run scripts/generate_kubernetes.py"


def test_the_prometheus_rule_is_the_rules_file() -> None:
    (rule,) = load(BASE / "prometheusrule.yaml")
    assert (
        rule["spec"]["groups"]
        == yaml.safe_load((ROOT / "dashboards" / "alerts" / "bleedwatch.yml").read_text())["groups"]
    )


def test_the_dashboards_are_configmaps_for_the_grafana_sidecar() -> None:
    maps = load(BASE / "dashboards.yaml")
    files = sorted((ROOT / "dashboards").glob("*.json"))
    assert len(maps) == len(files) == 3
    for cm, path in zip(maps, files, strict=True):
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["data"] == {path.name: path.read_text()}
        json.loads(cm["data"][path.name])


def test_the_overlay_sets_image_namespace_and_links() -> None:
    objs = objects("overlay")
    assert {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"} == {"bleedwatch"}
    images = {c["image"] for c in containers(objs)}
    assert images == {"registry.example.net/bleedwatch:0.1.0", "redis:7"}
    links = one(objs, "ConfigMap", "bleedwatch")["data"]["BLEEDWATCH_ALERT_LINKS_URL"]
    assert links.startswith("https://")
