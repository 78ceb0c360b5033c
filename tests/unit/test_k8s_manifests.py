"""docker/k8s/ as `kubectl kustomize` renders it (offline: no cluster), every object
valid against the Kubernetes schemas (kubernetes-validate; KEDA's ScaledObject, a CRD,
checked here for the fields its CRD requires), and what the manifests must keep: each
container runs an `inferq` command that exists, with options it takes; each INFERQ_*
variable is a setting or a variable a command reads; the API's probes are /healthz
and /readyz; each grace period outlasts the drain (and a spot worker's notice); every
workload takes the Secret and the ConfigMap; each ScaledObject scales a Deployment
serving the lane its query asks about."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from cli.main import main as inferq
from jobs.core.lanes import CELERY_LANES, MODEL_LANES
from jobs.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "docker" / "k8s"
SECRET, CONFIG = "inferq-secrets", "inferq-config"
# The oldest Kubernetes minor the manifests are checked against, besides the newest
# schemas kubernetes-validate has.
OLDEST = "1.29.0"
WORKLOADS = ("Deployment", "Job", "StatefulSet", "DaemonSet")
LANES = set(MODEL_LANES) | set(CELERY_LANES)
DESIRED = re.compile(r'^max\(inferq_desired_workers\{lane="(\w+)"\}\)$')


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: it renders docker/k8s (`kubectl kustomize`)")
    res = subprocess.run([kubectl, "kustomize", str(BASE)], capture_output=True, text=True,
                         check=False, timeout=120)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def of_kind(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def pod_specs(objs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for o in objs:
        if o["kind"] in WORKLOADS:
            yield f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"]


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def test_the_base_lists_every_manifest_and_sets_no_namespace(
        rendered: list[dict[str, Any]]) -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk
    assert "namespace" not in kustomization
    assert not [o for o in rendered if o["kind"] == "Namespace"
                or "namespace" in o["metadata"]]
    kinds = {o["kind"] for o in rendered}
    assert {"Deployment", "Service", "PodDisruptionBudget", "Job", "Secret", "ConfigMap",
            "ScaledObject"} <= kinds


@pytest.mark.parametrize("version", [OLDEST, "latest"])
def test_every_object_is_valid(rendered: list[dict[str, Any]], version: str) -> None:
    import kubernetes_validate

    if version == "latest":
        version = kubernetes_validate.latest_version()
    checked = 0
    for o in rendered:
        if o["apiVersion"].startswith("keda.sh/"):
            continue  # a CRD: test_scaled_objects
        try:
            kubernetes_validate.validate(o, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = ".".join(map(str, e.path))
            raise AssertionError(f"{o['kind']}/{o['metadata']['name']} (Kubernetes "
                                 f"{version}): {where}: {e.message}") from None
        checked += 1
    assert checked >= 12


def command_of(path: list[str]) -> click.Command:
    """The click command an argv (without `inferq`) names, its options parsed as the
    command would (an unknown command, option or value raises)."""
    ctx = inferq.make_context("inferq", list(path), resilient_parsing=False)
    cmd: click.Command = inferq
    while isinstance(cmd, click.Group):
        name, sub, rest = cmd.resolve_command(ctx, ctx.protected_args + ctx.args)
        assert sub is not None and name is not None
        ctx = sub.make_context(name, rest, parent=ctx)
        cmd = sub
    return cmd


def test_every_container_runs_an_inferq_command_that_exists(
        rendered: list[dict[str, Any]]) -> None:
    seen = set()
    for where, spec in pod_specs(rendered):
        for c in containers(spec):
            argv = [*c.get("command", []), *c.get("args", [])]
            assert argv[:1] == ["inferq"], f"{where}/{c['name']}: {argv}"
            try:
                cmd = command_of(argv[1:])
            except click.ClickException as e:
                pytest.fail(f"{where}/{c['name']}: `{' '.join(argv)}`: {e.format_message()}")
            seen.add(cmd.name)
            if "--lanes" in argv:
                lanes = argv[argv.index("--lanes") + 1].split(",")
                assert set(lanes) <= LANES, f"{where}: lanes {lanes}"
    assert {"api", "worker", "migrate", "import"} <= seen


def variables(o: dict[str, Any]) -> dict[str, str]:
    return {**o.get("data", {}), **o.get("stringData", {})}


def command_envvars() -> set[str]:
    """Variables the commands' options read (``envvar=``), all the way down."""
    out: set[str] = set()

    def walk(cmd: click.Command) -> None:
        for p in cmd.params:
            envvars = [p.envvar] if isinstance(p.envvar, str) else list(p.envvar or ())
            out.update(envvars)
        if isinstance(cmd, click.Group):
            for sub in cmd.commands.values():
                walk(sub)

    walk(inferq)
    return out


def test_every_inferq_variable_is_a_setting_or_read_by_a_command(
        rendered: list[dict[str, Any]]) -> None:
    known = {f"INFERQ_{name.upper()}" for name in Settings.model_fields} | command_envvars()
    assert "INFERQ_ADMIN_KEY" in known and "INFERQ_DRAIN_S" in known
    names: list[tuple[str, str]] = []
    for o in rendered:
        if o["kind"] in ("ConfigMap", "Secret"):
            names += [(f"{o['kind']}/{o['metadata']['name']}", n) for n in variables(o)]
    for where, spec in pod_specs(rendered):
        for c in containers(spec):
            names += [(f"{where}/{c['name']}", e["name"]) for e in c.get("env", [])]
    wrong = [(where, n) for where, n in names if n.startswith("INFERQ_") and n not in known]
    assert not wrong, wrong
    assert len(names) > 10


def environment(rendered: list[dict[str, Any]], c: dict[str, Any]) -> dict[str, str]:
    """A container's variables as the kubelet sets them: envFrom in order, then env."""
    sources = {(o["kind"], o["metadata"]["name"]): variables(o) for o in rendered
               if o["kind"] in ("ConfigMap", "Secret")}
    env: dict[str, str] = {}
    for ref in c.get("envFrom", []):
        kind = "ConfigMap" if "configMapRef" in ref else "Secret"
        name = (ref.get("configMapRef") or ref.get("secretRef"))["name"]
        env.update(sources[(kind, name)])
    env.update({e["name"]: e["value"] for e in c.get("env", []) if "value" in e})
    return env


def settings_of(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    with monkeypatch.context() as m:
        for k in list(os.environ):
            if k.startswith("INFERQ_"):
                m.delenv(k)
        for k, v in env.items():
            m.setenv(k, v)
        return Settings.from_env()


def test_every_workload_takes_the_secret_and_the_config(
        rendered: list[dict[str, Any]]) -> None:
    assert SECRET in of_kind(rendered, "Secret") and CONFIG in of_kind(rendered, "ConfigMap")
    secret = variables(of_kind(rendered, "Secret")[SECRET])
    assert {"INFERQ_DATABASE_URL", "INFERQ_REDIS_URL", "INFERQ_OBJECT_STORE_URL",
            "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "INFERQ_METRICS_TOKEN",
            "INFERQ_ADMIN_KEY"} <= set(secret)
    workloads = list(pod_specs(rendered))
    assert len(workloads) >= 6
    for where, spec in workloads:
        for c in containers(spec):
            refs = c.get("envFrom", [])
            assert {"secretRef": {"name": SECRET}} in refs, f"{where}/{c['name']}"
            assert {"configMapRef": {"name": CONFIG}} in refs, f"{where}/{c['name']}"


def test_every_environment_makes_valid_settings(rendered: list[dict[str, Any]],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    for where, spec in pod_specs(rendered):
        for c in containers(spec):
            st = settings_of(environment(rendered, c), monkeypatch)
            assert not st.embedded, f"{where}: every backend comes from the Secret"


def test_grace_periods_outlast_the_drain_and_the_spot_notice(
        rendered: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    spot = 0
    for where, spec in pod_specs(rendered):
        grace = spec.get("terminationGracePeriodSeconds")
        assert grace is not None, f"{where}: say how long a stop may take"
        for c in containers(spec):
            st = settings_of(environment(rendered, c), monkeypatch)
            assert grace > st.drain_s, f"{where}: {grace} s <= INFERQ_DRAIN_S {st.drain_s}"
            if "--spot" in c.get("args", []) or st.spot:
                spot += 1
                assert st.spot and st.drain_s < st.spot_notice_s < grace, where
    assert spot == 1


def test_the_api_probes_healthz_and_readyz(rendered: list[dict[str, Any]]) -> None:
    api = of_kind(rendered, "Deployment")["inferq-api"]["spec"]["template"]["spec"]
    (c,) = api["containers"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8000}
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["INFERQ_API_PORT"] == "8000" and env["INFERQ_API_HOST"] == "0.0.0.0"
    for where, spec in pod_specs(rendered):
        for x in containers(spec):
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                if probe in x:
                    path = x[probe]["httpGet"]["path"]
                    assert path == ("/readyz" if probe == "readinessProbe" else "/healthz"), \
                        f"{where}: {probe} {path}"
                    assert x[probe]["httpGet"]["port"] in {p["name"] for p in x["ports"]}
    svc = of_kind(rendered, "Service")["inferq-api"]["spec"]
    labels = of_kind(rendered, "Deployment")["inferq-api"]["spec"]["template"]["metadata"]
    assert svc["selector"].items() <= labels["labels"].items()
    assert svc["ports"] == [{"name": "http", "port": 8000, "targetPort": "http"}]


def lanes_of(deployment: dict[str, Any]) -> set[str]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    args = c.get("args", [])
    if "--lanes" in args:
        return set(args[args.index("--lanes") + 1].split(","))
    return {"flex"} if "--spot" in args else {"realtime", "jobs", "batch"}


def test_model_workers_ask_for_a_gpu_and_the_spot_pool_tolerates_spot_nodes(
        rendered: list[dict[str, Any]]) -> None:
    deployments = of_kind(rendered, "Deployment")
    workers = {n: d for n, d in deployments.items() if n.startswith("inferq-worker-")}
    assert {lanes: n for n, d in workers.items() for lanes in [",".join(sorted(lanes_of(d)))]
            } == {"control": "inferq-worker-control", "realtime": "inferq-worker-realtime",
                  "batch,jobs": "inferq-worker-batch", "flex": "inferq-worker-spot"}
    for name, d in workers.items():
        (c,) = d["spec"]["template"]["spec"]["containers"]
        gpus = {k: c["resources"].get(k, {}).get("nvidia.com/gpu") for k in ("requests",
                                                                              "limits")}
        want = None if lanes_of(d) == {"control"} else 1
        assert gpus == {"requests": want, "limits": want}, name
    spot = workers["inferq-worker-spot"]["spec"]["template"]["spec"]
    assert any("spot" in t["key"] or t.get("value") == "spot" for t in spot["tolerations"])
    assert {"name": "INFERQ_SPOT", "value": "true"} in spot["containers"][0]["env"]


def test_disruption_budgets_select_deployments(rendered: list[dict[str, Any]]) -> None:
    deployments = of_kind(rendered, "Deployment")
    budgets = of_kind(rendered, "PodDisruptionBudget")
    assert set(budgets) == {"inferq-api", "inferq-worker-control", "inferq-worker-realtime",
                            "inferq-worker-batch"}
    for name, pdb in budgets.items():
        labels = deployments[name]["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items(), name


def test_scaled_objects(rendered: list[dict[str, Any]]) -> None:
    """What KEDA's ScaledObject CRD requires (spec.scaleTargetRef.name, spec.triggers,
    each with a type and metadata of strings), and what inferq's need: a Prometheus
    trigger on inferq_desired_workers for a lane the target Deployment serves."""
    deployments = of_kind(rendered, "Deployment")
    scaled = of_kind(rendered, "ScaledObject")
    lanes = {}
    for name, so in scaled.items():
        assert so["apiVersion"] == "keda.sh/v1alpha1"
        spec = so["spec"]
        assert set(spec) <= {"scaleTargetRef", "minReplicaCount", "maxReplicaCount",
                             "pollingInterval", "cooldownPeriod", "idleReplicaCount",
                             "advanced", "triggers", "fallback", "initialCooldownPeriod"}
        target = spec["scaleTargetRef"]
        assert target.get("kind", "Deployment") == "Deployment"
        assert target.get("apiVersion", "apps/v1") == "apps/v1"
        assert target["name"] in deployments, name
        assert "replicas" not in deployments[target["name"]]["spec"], \
            f"{target['name']}: KEDA owns its count; an apply must not reset it"
        assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        for n in ("minReplicaCount", "maxReplicaCount", "pollingInterval", "cooldownPeriod"):
            assert isinstance(spec[n], int)
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "prometheus"
        meta = trigger["metadata"]
        assert all(isinstance(v, str) for v in meta.values()), name
        assert {"serverAddress", "query", "threshold"} <= set(meta)
        assert meta["metricType"] in ("AverageValue", "Value")
        assert float(meta["threshold"]) == 1
        m = DESIRED.match(meta["query"])
        assert m is not None, meta["query"]
        lane = m.group(1)
        assert lane in lanes_of(deployments[target["name"]]), (name, lane)
        lanes[lane] = name
        behavior = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get(
            "behavior", {})
        for rules in behavior.values():
            assert rules["policies"] and all(
                {"type", "value", "periodSeconds"} == set(p) for p in rules["policies"])
    assert set(lanes) == {"realtime", "batch", "flex"}
    assert scaled["inferq-worker-spot"]["spec"]["minReplicaCount"] == 0
