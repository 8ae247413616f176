"""The deployment files: ``deploy/k8s`` (and its docker-backend overlay) and the Compose trial.

Every manifest parses, the rendered objects validate against the Kubernetes schemas of
``kubernetes-validate`` (strict: no field the API does not know), and the invariants sunroom
relies on hold: probes on ``/readyz`` and ``/healthz`` at the container's port, a grace period
longer than the drain, secrets only from the Secret, resources set, selectors that match, no
privileged container, the Docker socket only in the docker-backend overlay, and the API
server's own cross-field rules that the schemas do not express. No cluster is involved: nothing
here is applied to one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Final

import kubernetes_validate  # type: ignore[import-untyped]
import pydantic
import pytest
import yaml  # type: ignore[import-untyped]

from sunroom.service.config import ServiceConfig
from tests.deploy.render import Unsupported, apply_json6902, load_all, render

ROOT: Final = Path(__file__).resolve().parents[2]
DEPLOY: Final = ROOT / "deploy"
K8S: Final = DEPLOY / "k8s"
COMPOSE: Final = DEPLOY / "compose" / "replicas.yaml"
DOC: Final = ROOT / "docs" / "deploy.md"

VARIANTS: Final = {"bwrap": K8S, "docker-backend": K8S / "docker-backend"}
"""Each directory ``kubectl apply -k`` takes to deploy sunroom, by its kernel backend."""
DEV_POSTGRES: Final = K8S / "dev-postgres"
"""The optional development database (applied on its own, after the base)."""

KUBERNETES: Final = ("1.33", kubernetes_validate.latest_version())
"""1.33: the first release with user namespaces (``hostUsers: false``) on by default."""

DEFAULT_DRAIN_GRACE_S: Final = 20.0
SECRET_ENV: Final = re.compile(r"TOKEN|PASSWORD|SECRET|DSN|_KEY$|^SUNROOM_DB$")
"""Environment names whose values are secrets: they must come from a secretKeyRef."""

CAPABILITIES: Final = {
    "bwrap": {"CHOWN", "DAC_OVERRIDE", "KILL", "SETGID", "SETUID"},
    "docker-backend": {"CHOWN"},
}
"""The capabilities each variant adds (measured, docs/deploy.md): no more may creep in."""

Doc = dict[str, Any]


def _one(docs: list[Doc], kind: str) -> Doc:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def _pod(docs: list[Doc]) -> Doc:
    spec: Doc = _one(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


def _container(docs: list[Doc]) -> Doc:
    (container,) = _pod(docs)["containers"]
    assert isinstance(container, dict)
    return container


def _env(docs: list[Doc]) -> dict[str, str]:
    """The container's plain environment as the kubelet builds it: envFrom, then env over it."""
    out: dict[str, str] = {}
    configmaps = {
        d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"
    }
    container = _container(docs)
    for source in container.get("envFrom", []):
        out.update(configmaps[source["configMapRef"]["name"]])
    for var in container.get("env", []):
        if "value" in var:
            out[var["name"]] = var["value"]
    return out


def _drain_grace_s(env: dict[str, str]) -> float:
    return float(env.get("SUNROOM_DRAIN_GRACE_S", DEFAULT_DRAIN_GRACE_S))


def _port_number(container: Doc, port: int | str) -> int:
    """A probe's or Service's ``port`` (a number or a container port's name) as a number."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    assert isinstance(number, int)
    return number


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> tuple[str, list[Doc]]:
    """``(name, rendered objects)`` of each variant."""
    name: str = request.param
    return name, render(VARIANTS[name])


# --- parsing and schemas ---------------------------------------------------------------------


def test_every_file_under_deploy_parses_as_yaml() -> None:
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 12, files
    for path in files:
        docs = list(yaml.safe_load_all(path.read_text()))
        assert docs and all(isinstance(d, (dict, list)) for d in docs), path


def test_every_manifest_in_deploy_k8s_is_listed_in_its_kustomization() -> None:
    directories = sorted(p.parent for p in K8S.rglob("kustomization.yaml"))
    assert set(directories) == {*VARIANTS.values(), DEV_POSTGRES}
    for directory in directories:
        (kustomization,) = load_all(directory / "kustomization.yaml")
        listed = set(kustomization.get("resources", [])) | {
            p["path"] for p in kustomization.get("patches", [])
        }
        on_disk = {p.name for p in directory.glob("*.yaml")} - {"kustomization.yaml"}
        assert on_disk <= listed, f"{directory}: not in kustomization.yaml: {on_disk - listed}"


@pytest.mark.parametrize("version", KUBERNETES)
def test_every_rendered_object_validates_against_the_kubernetes_schema(
    variant: tuple[str, list[Doc]], version: str
) -> None:
    _, docs = variant
    assert {d["kind"] for d in docs} >= {
        "Namespace",
        "ServiceAccount",
        "Secret",
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
    }
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_refuses_a_field_the_api_does_not_know() -> None:
    deployment = _one(render(K8S), "Deployment")
    typo = apply_json6902(
        deployment,
        [{"op": "add", "path": "/spec/template/spec/containers/0/readinesProbe", "value": {}}],
    )
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, KUBERNETES[0], strict=True)


def test_the_renderer_refuses_what_it_does_not_render(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\nnamePrefix: x-\n")
    with pytest.raises(Unsupported, match="namePrefix"):
        render(tmp_path)
    with pytest.raises(AssertionError, match="test /a"):
        apply_json6902({"a": 1}, [{"op": "test", "path": "/a", "value": 2}])


def test_the_docker_backend_patch_still_fits_the_base() -> None:
    base, docker = _container(render(K8S)), _container(render(VARIANTS["docker-backend"]))
    assert {"name": "SUNROOM_BACKEND", "value": "bwrap"} in base["env"]
    assert {"name": "SUNROOM_BACKEND", "value": "docker"} in docker["env"]
    # the rest of the base's environment is untouched
    assert docker["env"][: len(base["env"])] == [
        v if v["name"] != "SUNROOM_BACKEND" else {**v, "value": "docker"} for v in base["env"]
    ]


# --- probes, drain, ports --------------------------------------------------------------------


def test_probes_point_at_readyz_and_healthz_on_the_port_sunroom_listens_on(
    variant: tuple[str, list[Doc]],
) -> None:
    _, docs = variant
    container = _container(docs)
    command = container["command"]
    listens = int(command[command.index("--port") + 1])
    assert command[:2] == ["sunroom", "serve"]
    assert command[command.index("--host") + 1] == "0.0.0.0" and "--expose" in command
    paths = {}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        get = container[probe]["httpGet"]
        assert _port_number(container, get["port"]) == listens, probe
        assert get.get("scheme", "HTTP") == "HTTP" and "httpHeaders" not in get, probe
        paths[probe] = get["path"]
    assert paths == {
        "readinessProbe": "/readyz",
        "livenessProbe": "/healthz",
        "startupProbe": "/healthz",
    }


def test_the_grace_period_outlasts_the_prestop_sleep_plus_the_drain(
    variant: tuple[str, list[Doc]],
) -> None:
    _, docs = variant
    pod, container = _pod(docs), _container(docs)
    grace = pod["terminationGracePeriodSeconds"]
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = _drain_grace_s(_env(docs))
    assert drain == DEFAULT_DRAIN_GRACE_S
    assert grace > pre_stop + drain, (grace, pre_stop, drain)


def test_the_advertised_url_is_the_pods_own_address_and_port(
    variant: tuple[str, list[Doc]],
) -> None:
    _, docs = variant
    container = _container(docs)
    env = container["env"]
    pod_ip = next(v for v in env if v["name"] == "POD_IP")
    assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    port = container["command"][container["command"].index("--port") + 1]
    assert _env(docs)["SUNROOM_ADVERTISE_URL"] == f"http://$(POD_IP):{port}"


def test_a_variable_is_defined_before_an_env_value_refers_to_it(
    variant: tuple[str, list[Doc]],
) -> None:
    """The kubelet expands ``$(NAME)`` only for names defined earlier (else: left as is)."""
    _, docs = variant
    seen: set[str] = set()
    for var in _container(docs)["env"]:
        for name in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", var.get("value", "")):
            assert name in seen, f"{var['name']} refers to {name} before it is defined"
        seen.add(var["name"])


def test_the_host_check_lets_probes_replicas_and_the_service_name_in(
    variant: tuple[str, list[Doc]],
) -> None:
    """Probes and forwarded writes carry the pod IP as Host; clients the Service's names."""
    _, docs = variant
    service = _one(docs, "Service")
    namespace = service["metadata"]["namespace"]
    pod_ip = "10.1.2.3"
    allowed = _env(docs)["SUNROOM_ALLOWED_HOSTS"].replace("$(POD_IP)", pod_ip)
    config = ServiceConfig(
        host="0.0.0.0", expose=True, allowed_hosts=tuple(allowed.split(",")), token="t" * 32
    )
    name = service["metadata"]["name"]
    for host in (
        f"{pod_ip}:8765",
        f"{name}:8765",
        f"{name}.{namespace}",
        f"{name}.{namespace}.svc",
        f"{name}.{namespace}.svc.cluster.local:8765",
    ):
        assert config.host_allowed(host), host
    assert not config.host_allowed("evil.example")
    assert "*" not in allowed.split(",")


# --- secrets ---------------------------------------------------------------------------------


def test_secrets_come_only_from_the_secret(variant: tuple[str, list[Doc]]) -> None:
    _, docs = variant
    secret = _one(docs, "Secret")
    keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    refs = {}
    for var in _container(docs)["env"]:
        if SECRET_ENV.search(var["name"]):
            assert "value" not in var, f"{var['name']} is a literal"
            ref = var["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] in keys
            refs[var["name"]] = ref["key"]
    assert set(refs) == {"SUNROOM_TOKEN", "SUNROOM_DB"}
    for configmap in (d for d in docs if d["kind"] == "ConfigMap"):
        for key, value in configmap["data"].items():
            assert not SECRET_ENV.search(key), key
            assert "://" not in value or "@" not in value, f"{key} looks like a credential URL"
    for value in _env(docs).values():
        assert "postgresql://" not in value and "postgres://" not in value


def test_the_secret_placeholders_fail_closed_if_applied_unedited() -> None:
    """The token is refused by sunroom itself; the DSN names a host that never resolves."""
    secret = _one(render(K8S), "Secret")
    token, dsn = secret["stringData"]["token"], secret["stringData"]["dsn"]
    assert "CHANGE-ME" in token and "CHANGE-ME" in dsn
    with pytest.raises(pydantic.ValidationError, match="at least 16 characters"):
        ServiceConfig(token=token)
    host = dsn.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)[0]
    assert host.endswith(".invalid"), host  # RFC 2606: never resolves


# --- resources, selectors, accounts ----------------------------------------------------------


def test_every_container_requests_cpu_and_memory_and_caps_memory(
    variant: tuple[str, list[Doc]],
) -> None:
    _, docs = variant
    for container in _pod(docs)["containers"]:
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), container["name"]
        assert "memory" in resources["limits"], container["name"]


def test_the_selectors_of_service_pdb_and_networkpolicy_match_the_pods(
    variant: tuple[str, list[Doc]],
) -> None:
    _, docs = variant
    deployment = _one(docs, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    own = deployment["spec"]["selector"]["matchLabels"]
    assert own.items() <= labels.items()
    service = _one(docs, "Service")
    pdb = _one(docs, "PodDisruptionBudget")
    policy = _one(docs, "NetworkPolicy")
    for selector in (
        service["spec"]["selector"],
        pdb["spec"]["selector"]["matchLabels"],
        policy["spec"]["podSelector"]["matchLabels"],
    ):
        assert selector and selector.items() <= labels.items(), selector
    # the PDB lets one replica go at a time, and leaves replicas to go
    spec = pdb["spec"]
    replicas = deployment["spec"]["replicas"]
    assert replicas >= 3
    assert spec.get("maxUnavailable") == 1 or spec.get("minAvailable") == replicas - 1
    # the Service reaches the port sunroom listens on
    (port,) = service["spec"]["ports"]
    assert _port_number(_container(docs), port["targetPort"]) == 8765


def test_everything_lives_in_the_namespace_and_mounts_no_api_token(
    variant: tuple[str, list[Doc]],
) -> None:
    _, docs = variant
    namespace = _one(docs, "Namespace")["metadata"]["name"]
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == namespace, doc["kind"]
    account = _one(docs, "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    pod = _pod(docs)
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is False


# --- privileges ------------------------------------------------------------------------------


def test_no_container_is_privileged_and_capabilities_are_the_measured_ones(
    variant: tuple[str, list[Doc]],
) -> None:
    name, docs = variant
    doc = DOC.read_text()
    for container in _pod(docs)["containers"]:
        context = container["securityContext"]
        assert context.get("privileged") is not True
        assert context["capabilities"]["drop"] == ["ALL"]
        added = set(context["capabilities"]["add"])
        assert added == CAPABILITIES[name]
        for cap in added:
            assert f"`{cap}`" in doc, f"docs/deploy.md does not explain {cap}"
        assert context["readOnlyRootFilesystem"] is True


def test_the_api_servers_cross_field_rules_hold(variant: tuple[str, list[Doc]]) -> None:
    """What the schemas cannot say but the API server refuses (or the pod cannot run)."""
    _, docs = variant
    pod = _pod(docs)
    for container in pod["containers"]:
        context = container["securityContext"]
        added = set(context["capabilities"].get("add", []))
        if context.get("allowPrivilegeEscalation") is False:
            assert not context.get("privileged") and "SYS_ADMIN" not in added
        if context.get("procMount") == "Unmasked":
            assert pod.get("hostUsers") is False, "procMount Unmasked needs hostUsers: false"
    if pod.get("hostUsers") is False:
        assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
        assert not [v for v in pod["volumes"] if "hostPath" in v]


def test_the_uid_range_is_one_the_pods_user_namespace_maps(
    variant: tuple[str, list[Doc]],
) -> None:
    """In a pod user namespace only 0-65535 exist; without one, sunroom's reserved range."""
    _, docs = variant
    env = _env(docs)
    base, count = int(env["SUNROOM_UID_BASE"]), int(env["SUNROOM_UID_COUNT"])
    if _pod(docs).get("hostUsers") is False:
        assert base > 1000 and base + count <= 65536
    else:
        assert base >= 1879048192 and base + count <= 2147483648


def test_only_the_docker_backend_overlay_mounts_the_docker_socket(
    variant: tuple[str, list[Doc]],
) -> None:
    name, docs = variant
    pod = _pod(docs)
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    sockets = {p for p in host_paths if p.endswith("docker.sock")}
    mounted = {m["mountPath"] for m in _container(docs)["volumeMounts"]}
    if name == "docker-backend":
        assert sockets == {"/var/run/docker.sock"} and "/var/run/docker.sock" in mounted
        assert host_paths == {"/var/run/docker.sock", "/run/sunroom"}
        assert _env(docs)["SUNROOM_DOCKER_RUNDIR"] == "/run/sunroom" and "/run/sunroom" in mounted
        text = (VARIANTS[name] / "kustomization.yaml").read_text()
        assert "root on the node" in text
    else:
        assert not host_paths and not any("docker" in m for m in mounted)


def test_the_bwrap_settings_are_there_and_explained() -> None:
    docs = render(K8S)
    pod, context = _pod(docs), _container(docs)["securityContext"]
    assert pod["hostUsers"] is False
    assert context["seccompProfile"] == {"type": "Unconfined"}
    assert context["appArmorProfile"] == {"type": "Unconfined"}
    assert context["procMount"] == "Unmasked"
    assert _env(docs)["SUNROOM_BACKEND"] == "bwrap"
    doc = DOC.read_text()
    for word in ("hostUsers: false", "Unconfined", "procMount: Unmasked", "cgroup"):
        assert word in doc, word
    namespace = _one(docs, "Namespace")["metadata"]["labels"]
    assert namespace["pod-security.kubernetes.io/enforce"] == "privileged"
    assert namespace["pod-security.kubernetes.io/warn"] == "baseline"


# --- the development database ----------------------------------------------------------------


def test_the_dev_database_validates_and_only_the_replicas_reach_it() -> None:
    docs = render(DEV_POSTGRES)
    assert {d["kind"] for d in docs} == {"Secret", "Service", "StatefulSet", "NetworkPolicy"}
    for doc in docs:
        assert doc["metadata"]["namespace"] == "sunroom"
        for version in KUBERNETES:
            kubernetes_validate.validate(doc, version, strict=True)
    (base,) = load_all(K8S / "kustomization.yaml")
    assert not any("dev-postgres" in r for r in base["resources"])  # never applied by default
    statefulset = _one(docs, "StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    (container,) = pod["containers"]
    password = next(v for v in container["env"] if v["name"] == "POSTGRES_PASSWORD")
    assert password["valueFrom"]["secretKeyRef"] == {"name": "postgres", "key": "password"}
    assert _one(docs, "Secret")["stringData"]["password"] == "CHANGE-ME"
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert _one(docs, "Service")["spec"]["selector"].items() <= labels.items()
    # only sunroom's pods get in, and sunroom's policy lets them out to it
    sunroom = render(K8S)
    replicas = _one(sunroom, "Deployment")["spec"]["template"]["metadata"]["labels"]
    (rule,) = _one(docs, "NetworkPolicy")["spec"]["ingress"]
    (peer,) = rule["from"]
    assert peer["podSelector"]["matchLabels"].items() <= replicas.items()
    egress = _one(sunroom, "NetworkPolicy")["spec"]["egress"]
    assert any(
        to.get("podSelector", {}).get("matchLabels", {}).items() <= labels.items()
        and to.get("podSelector")
        and {"port": 5432, "protocol": "TCP"} in r["ports"]
        for r in egress
        for to in r["to"]
    )


# --- compose ---------------------------------------------------------------------------------


def _compose() -> Doc:
    (doc,) = load_all(COMPOSE)
    return doc


def _replicas(doc: Doc) -> dict[str, Doc]:
    return {
        name: svc
        for name, svc in doc["services"].items()
        if svc.get("command", [])[:2] == ["sunroom", "serve"]
    }


def test_compose_runs_two_replicas_over_one_database_with_their_own_urls() -> None:
    doc = _compose()
    replicas = _replicas(doc)
    assert len(replicas) == 2
    envs = {name: svc["environment"] for name, svc in replicas.items()}
    assert len({e["SUNROOM_DB"] for e in envs.values()}) == 1
    (dsn,) = {e["SUNROOM_DB"] for e in envs.values()}
    assert dsn.startswith("postgresql://") and "@postgres:5432/" in dsn
    assert "${SUNROOM_PG_PASSWORD" in dsn  # the password comes from the environment
    assert doc["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith(
        "${SUNROOM_PG_PASSWORD"
    )
    urls = {name: e["SUNROOM_ADVERTISE_URL"] for name, e in envs.items()}
    assert len(set(urls.values())) == 2
    for name, svc in replicas.items():
        port = svc["command"][svc["command"].index("--port") + 1]
        assert urls[name] == f"http://{name}:{port}"  # the service's name on the network
        assert svc["hostname"] == name  # distinct: each sweeps only its own kernels
        allowed = envs[name]["SUNROOM_ALLOWED_HOSTS"].split(",")
        assert set(replicas) <= set(allowed)  # forwarded writes carry the replica's name
        assert svc["depends_on"]["postgres"]["condition"] == "service_healthy"
    published = [p for svc in replicas.values() for p in svc["ports"]]
    assert len(set(published)) == 2 and all(p.startswith("127.0.0.1:") for p in published)


def test_compose_takes_secrets_from_the_environment_and_outlasts_the_drain() -> None:
    for svc in _replicas(_compose()).values():
        env = svc["environment"]
        assert env["SUNROOM_TOKEN"].startswith("${SUNROOM_TOKEN:?")
        for name, value in env.items():  # SUNROOM_DB: its password is checked above
            if SECRET_ENV.search(name) and name != "SUNROOM_DB":
                assert value.startswith(f"${{{name}:"), f"{name} is not from the environment"
        drain = _drain_grace_s(env)
        grace = float(svc["stop_grace_period"].removesuffix("s"))
        assert grace > drain and svc.get("stop_signal", "SIGTERM") == "SIGTERM"


def _compose_v2() -> str | None:
    """The ``docker`` binary if it has the Compose v2 plugin, else None."""
    docker = shutil.which("docker")
    if docker is None:
        return None
    try:
        done = subprocess.run(
            [docker, "compose", "version"], capture_output=True, timeout=20, check=False
        )
    except subprocess.TimeoutExpired:
        return None
    return docker if done.returncode == 0 else None


@pytest.mark.kernel
def test_docker_compose_accepts_the_file() -> None:
    docker = _compose_v2()
    if docker is None:
        pytest.skip("docker compose (the v2 plugin) is not installed here")
    env = {**os.environ, "SUNROOM_TOKEN": "t" * 32, "SUNROOM_PG_PASSWORD": "p" * 24}
    done = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rendered = yaml.safe_load(
        subprocess.run(
            [docker, "compose", "-f", str(COMPOSE), "config"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=True,
        ).stdout
    )
    assert {"sunroom-a", "sunroom-b", "postgres"} <= set(rendered["services"])
