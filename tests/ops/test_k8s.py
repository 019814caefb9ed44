"""The Kubernetes manifests of ops/k8s/ (docs/OPERATIONS.md, "Kubernetes"), offline: no cluster,
no network, nothing downloaded at test time.

* each overlay renders with kustomize (the version scripts/setup.sh installs; SL_KUSTOMIZE);
* every rendered object of a built-in kind validates against the Kubernetes JSON schemas of
  K8S_VERSIONS in strict mode (unknown fields fail), from the PyPI package kubernetes-validate,
  which bundles them; KEDA's ScaledObject and TriggerAuthentication, whose CRD schemas it does
  not bundle, are checked field by field against KEDA's documented Kafka scaler here, and the
  ScaledObject's HPA behavior against the HorizontalPodAutoscaler schema;
* every container's environment, resolved from the rendered ConfigMap and Secret as the
  kubelet resolves it (image ENV of the Dockerfile, envFrom, env, secretKeyRef), passes the
  real binary's --check-config (SL_BINARY_DIR): every SLUICE_* key is an option and every value
  is accepted; and the committed placeholder master key is refused at start;
* structure: probes on the ports the processes listen on, grace periods above the exit bounds
  of docs/CONFIG.md, secrets only through secretKeyRef, replicas within the partitions the docs
  and scripts create, one PodDisruptionBudget per Deployment, the security context, resources
  with the measured figures they cite, the metrics Services and the scrape jobs.

`promtool check config` checks ops/k8s/prometheus-scrape.yml (tests/ops/CMakeLists.txt).
A missing tool is a failing test with the reason, never a skip."""

import base64
import functools
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess

import pytest
import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
K8S = os.path.join(REPO, "ops", "k8s")
OVERLAYS = ("dev", "production")
# Strict validation against the oldest Kubernetes whose `kubectl apply -k` embeds kustomize v5
# (1.27: v5.0.1, the version scripts/setup.sh pins), one in between, and the newest that
# kubernetes-validate 1.37.0 bundles.
K8S_VERSIONS = ("1.27", "1.32", "1.37")
PROCESSES = {  # Deployment name -> (binary under SL_BINARY_DIR, the process's component label)
    "sluice-consumer": ("consumer/sluice-consumer", "consumer"),
    "sluice-recorder": ("recorder/sluice-recorder", "recorder"),
    "sluice-api": ("api/sluice-api", "api"),
}
# Options whose value is, or may carry, a password or a key: only ever from a Secret.
# (The **secret** options of docs/CONFIG.md are added to these.)
CREDENTIAL_ENVS = {"SLUICE_REDIS_URL", "SLUICE_PG_DSN", "SLUICE_KAFKA_SASL_USERNAME"}


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


# ==== tools ====

def kustomize_exe():
    exe = os.environ.get("SL_KUSTOMIZE")
    if exe:
        if not os.access(exe, os.X_OK):
            pytest.fail(f"SL_KUSTOMIZE={exe} is not an executable")
        return exe
    cache = os.environ.get("SLUICE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                               "sluice")
    for exe in (os.path.join(cache, "bin", "kustomize"), shutil.which("kustomize")):
        if exe and os.access(exe, os.X_OK):
            return exe
    pytest.fail("kustomize not found (scripts/setup.sh installs it into "
                "~/.cache/sluice/bin with the Go toolchain; or set SL_KUSTOMIZE)")


def k8s_validate():
    try:
        import kubernetes_validate
    except ImportError as e:
        pytest.fail(f"cannot import kubernetes_validate ({e}): pip package kubernetes-validate, "
                    "installed into the test venv by scripts/setup.sh")
    return kubernetes_validate


def binary(rel):
    bdir = os.environ.get("SL_BINARY_DIR")
    if not bdir:
        pytest.fail("SL_BINARY_DIR is not set (ctest sets it; by hand: SL_BINARY_DIR=build/<dir>)")
    exe = os.path.join(bdir, rel)
    if not os.access(exe, os.X_OK):
        pytest.fail(f"{exe} not built")
    return exe


@functools.lru_cache(maxsize=None)
def render(overlay):
    r = subprocess.run([kustomize_exe(), "build", os.path.join(K8S, "overlays", overlay)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"kustomize build overlays/{overlay} failed:\n{r.stderr}"
    return tuple(d for d in yaml.safe_load_all(r.stdout) if d)


def objs(overlay, kind):
    return [o for o in render(overlay) if o["kind"] == kind]


def obj(overlay, kind, name):
    found = [o for o in objs(overlay, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{overlay}: expected one {kind} {name}, found {len(found)}"
    return found[0]


def deployments(overlay):
    return {d["metadata"]["name"]: d for d in objs(overlay, "Deployment")}


def secret_data(secret):
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


# ==== what the docs and the scripts say ====

@functools.lru_cache(maxsize=None)
def config_options():
    """docs/CONFIG.md: environment name -> {name, type, default, secret}."""
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| `(SLUICE_[A-Z0-9_]+)` \| (\w+) \| [^|]* \| `([^`]*)` \|"
                      r" (.*) \|$", read(os.path.join(REPO, "docs", "CONFIG.md")), re.M)
    assert len(rows) >= 60, "docs/CONFIG.md: option table not found"
    return {env: {"name": name, "type": typ, "default": default, "secret": "**secret**" in desc}
            for name, env, typ, default, desc in rows}


def secret_envs():
    return {e for e, o in config_options().items() if o["secret"]} | CREDENTIAL_ENVS


def effective(env, name):
    """The value a process runs with: its environment, else the default of docs/CONFIG.md."""
    return env[name] if name in env else config_options()[name]["default"]


@functools.lru_cache(maxsize=None)
def image_env():
    """The SLUICE_* defaults of the Dockerfile's runtime stage (ENV), the lowest layer of a
    container's environment."""
    text = read(os.path.join(REPO, "Dockerfile"))
    m = re.search(r"^ENV ((?:.*\\\n)*.*)$", text, re.M)
    assert m, "Dockerfile: no ENV"
    pairs = shlex.split(m.group(1).replace("\\\n", " "))
    return dict(p.split("=", 1) for p in pairs)


def docs_section(title):
    text = read(os.path.join(REPO, "docs", "OPERATIONS.md"))
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f'docs/OPERATIONS.md has no "## {title}" section'
    return m.group(1)


def production_partitions():
    """The partition count of sluice.deliveries the Kubernetes section tells operators to create,
    which must be within the production range of "Topics and partitions"."""
    k8s = docs_section("Kubernetes")
    m = re.search(r"sluicectl topics ensure --partitions (\d+)", k8s)
    assert m, "docs/OPERATIONS.md, Kubernetes: no `sluicectl topics ensure --partitions N`"
    n = int(m.group(1))
    low = re.search(r"default (\d+) locally; (\d+)-(\d+) in production", docs_section("Topics and partitions"))
    assert low, "docs/OPERATIONS.md, Topics and partitions: production range not found"
    assert n >= int(low.group(2)), f"{n} partitions is below the documented production range"
    return n


def local_partitions():
    """What scripts/stack.sh, compose.yaml and `sluicectl topics ensure` create by default."""
    counts = {int(x) for x in re.findall(r"SLUICE_PARTITIONS:-(\d+)",
                                         read(os.path.join(REPO, "scripts", "stack.sh"))
                                         + read(os.path.join(REPO, "compose.yaml")))}
    counts |= {int(x) for x in re.findall(r"with N partitions \(default (\d+)\)",
                                          read(os.path.join(REPO, "ctl", "ctl_kafka.c")))}
    assert len(counts) == 1, f"the scripts disagree on the default partition count: {counts}"
    return counts.pop()


def partitions_for(overlay):
    return production_partitions() if overlay == "production" else local_partitions()


# ==== a container's environment, as the kubelet builds it ====

def service_link_env(overlay):
    """What the kubelet adds for every Service with a cluster IP when enableServiceLinks is not
    false (headless Services add nothing)."""
    env = {}
    for svc in objs(overlay, "Service"):
        if svc["spec"].get("clusterIP") == "None":
            continue
        n = svc["metadata"]["name"].upper().replace("-", "_")
        port = svc["spec"]["ports"][0]["port"]
        env.update({f"{n}_SERVICE_HOST": "10.96.0.10", f"{n}_SERVICE_PORT": str(port),
                    f"{n}_PORT": f"tcp://10.96.0.10:{port}",
                    f"{n}_PORT_{port}_TCP": f"tcp://10.96.0.10:{port}",
                    f"{n}_PORT_{port}_TCP_ADDR": "10.96.0.10"})
    return env


def container_env(overlay, deploy, links=None):
    pod = deploy["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = dict(image_env())
    own = {}
    for ef in c.get("envFrom", []):
        if "configMapRef" in ef:
            data = obj(overlay, "ConfigMap", ef["configMapRef"]["name"]).get("data", {})
        else:
            data = secret_data(obj(overlay, "Secret", ef["secretRef"]["name"]))
        own.update({ef.get("prefix", "") + k: v for k, v in data.items()})
    for e in c.get("env", []):
        if "value" in e:
            own[e["name"]] = e["value"]
            continue
        src = e["valueFrom"]
        if "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            data = secret_data(obj(overlay, "Secret", ref["name"]))
        elif "configMapKeyRef" in src:
            ref = src["configMapKeyRef"]
            data = obj(overlay, "ConfigMap", ref["name"]).get("data", {})
        else:
            own[e["name"]] = "x"  # fieldRef / resourceFieldRef: a value the kubelet fills in
            continue
        if ref["key"] in data:
            own[e["name"]] = data[ref["key"]]
        else:
            assert ref.get("optional"), f"{overlay}: {e['name']} refers to a missing key {ref}"
    env.update(own)
    if links if links is not None else pod.get("enableServiceLinks", True):
        for k, v in service_link_env(overlay).items():
            env.setdefault(k, v)
    return env


def run_process(rel, env, args, timeout=30):
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    base.update(env)
    return subprocess.run([binary(rel), *args], env=base, capture_output=True, text=True,
                          timeout=timeout)


# ==== rendering and schemas ====

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_every_process(overlay):
    kinds = {}
    for o in render(overlay):
        kinds.setdefault(o["kind"], set()).add(o["metadata"]["name"])
    assert set(deployments(overlay)) == set(PROCESSES)
    assert len(kinds["PodDisruptionBudget"]) == 3
    assert len(kinds["Namespace"]) == 1 and len(kinds["ConfigMap"]) == 1
    assert len(kinds["Secret"]) == 1
    ns = next(iter(kinds["Namespace"]))
    for o in render(overlay):
        if o["kind"] != "Namespace":
            assert o["metadata"].get("namespace") == ns, o["metadata"]


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_objects_validate_against_the_kubernetes_schemas(overlay, version):
    kv = k8s_validate()
    checked, errors = 0, []
    for o in render(overlay):
        if o["apiVersion"].startswith("keda.sh/"):
            continue  # CRDs: test_keda_* below
        try:
            kv.validate(o, version, strict=True)
        except kv.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            errors.append(f"{o['kind']}/{o['metadata']['name']}: {path}: {e.message}")
        except kv.SchemaNotFoundError as e:
            errors.append(e.message)
        checked += 1
    assert not errors, f"against Kubernetes {version}:\n" + "\n".join(errors)
    assert checked >= 12


# ==== KEDA (the CRD schemas are not bundled: structure, per KEDA 2.17's Kafka scaler docs) ====

SCALEDOBJECT_SPEC = {"scaleTargetRef", "pollingInterval", "initialCooldownPeriod", "cooldownPeriod",
                     "idleReplicaCount", "minReplicaCount", "maxReplicaCount", "fallback",
                     "advanced", "triggers"}
KAFKA_METADATA = {"bootstrapServers", "consumerGroup", "topic", "lagThreshold",
                  "activationLagThreshold", "offsetResetPolicy", "allowIdleConsumers",
                  "scaleToZeroOnInvalidOffset", "excludePersistentLag", "limitToPartitionsWithLag",
                  "version", "partitionLimitation", "sasl", "saslTokenProvider", "tls", "unsafeSsl",
                  "awsRegion"}
KAFKA_AUTH_PARAMS = {"sasl", "username", "password", "tls", "ca", "cert", "key", "keyPassword",
                     "saslTokenProvider", "oauthTokenEndpointUri", "scopes", "oauthExtensions"}
SASL_OF_MECHANISM = {"PLAIN": "plaintext", "SCRAM-SHA-256": "scram_sha256",
                     "SCRAM-SHA-512": "scram_sha512"}


def scaled_object():
    (so,) = objs("production", "ScaledObject")
    return so


def test_keda_scaledobject_structure():
    so = scaled_object()
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    spec = so["spec"]
    assert set(spec) <= SCALEDOBJECT_SPEC, set(spec) - SCALEDOBJECT_SPEC
    ref = spec["scaleTargetRef"]
    assert set(ref) <= {"name", "apiVersion", "kind", "envSourceContainerName"}
    assert ref.get("apiVersion", "apps/v1") == "apps/v1" and ref.get("kind", "Deployment") == "Deployment"
    assert ref["name"] == "sluice-consumer" and ref["name"] in deployments("production")
    for k in ("pollingInterval", "minReplicaCount", "maxReplicaCount"):
        assert isinstance(spec[k], int) and spec[k] >= 0, k
    # never scaled to zero: consumers also serve the Redis retry schedule, invisible in the lag
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    (trig,) = spec["triggers"]
    assert set(trig) <= {"type", "name", "metadata", "authenticationRef", "metricType",
                         "useCachedMetrics"}
    assert trig["type"] == "kafka"
    md = trig["metadata"]
    assert set(md) <= KAFKA_METADATA, set(md) - KAFKA_METADATA
    assert {"bootstrapServers", "consumerGroup", "topic", "lagThreshold"} <= set(md)
    for k, v in md.items():  # KEDA's metadata is map[string]string: a YAML number is refused
        assert isinstance(v, str), f"trigger metadata {k} must be a string, is {v!r}"
    assert re.fullmatch(r"[1-9][0-9]*", md["lagThreshold"])
    assert md.get("offsetResetPolicy", "latest") in ("latest", "earliest")
    assert md.get("allowIdleConsumers", "false") == "false"
    assert md.get("tls", "disable") in ("enable", "disable")
    assert md.get("sasl", "none") in ("plaintext", "scram_sha256", "scram_sha512", "gssapi",
                                      "oauthbearer", "none")


def test_keda_hpa_behavior_is_a_valid_hpa_behavior():
    kv = k8s_validate()
    so = scaled_object()
    behavior = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
           "metadata": {"name": "keda-hpa-sluice-consumer"},
           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                       "name": "sluice-consumer"},
                    "minReplicas": so["spec"]["minReplicaCount"],
                    "maxReplicas": so["spec"]["maxReplicaCount"], "behavior": behavior}}
    for version in K8S_VERSIONS:
        kv.validate(hpa, version, strict=True)


def test_keda_trigger_matches_the_consumers_configuration():
    """The trigger watches the group the consumers join, on the topic they read, through the
    brokers and the security they use."""
    so = scaled_object()
    md = so["spec"]["triggers"][0]["metadata"]
    env = container_env("production", deployments("production")["sluice-consumer"])
    assert md["topic"] == effective(env, "SLUICE_TOPIC_DELIVERIES")
    assert md["consumerGroup"] == effective(env, "SLUICE_CONSUMER_GROUP")
    assert md["bootstrapServers"] == effective(env, "SLUICE_KAFKA_BROKERS")
    # the consumers' auto.offset.reset
    reset = re.search(r'"auto.offset.reset", "(\w+)"', read(os.path.join(REPO, "common", "sl_kafka.c")))
    assert reset and md["offsetResetPolicy"] == reset.group(1)
    proto = effective(env, "SLUICE_KAFKA_SECURITY_PROTOCOL")
    assert md.get("tls", "disable") == ("enable" if proto in ("SSL", "SASL_SSL") else "disable")
    if proto.startswith("SASL_"):
        mech = effective(env, "SLUICE_KAFKA_SASL_MECHANISM")
        assert md.get("sasl") == SASL_OF_MECHANISM[mech]
    else:
        assert md.get("sasl", "none") == "none"


def test_keda_trigger_authentication_reads_the_processes_secret():
    so = scaled_object()
    trig = so["spec"]["triggers"][0]
    md = trig["metadata"]
    if md.get("sasl", "none") == "none":
        return
    auth = obj("production", "TriggerAuthentication", trig["authenticationRef"]["name"])
    assert trig["authenticationRef"].get("kind", "TriggerAuthentication") == "TriggerAuthentication"
    assert set(auth["spec"]) <= {"secretTargetRef", "env", "configMapTargetRef", "podIdentity",
                                 "hashiCorpVault", "azureKeyVault", "awsSecretManager",
                                 "gcpSecretManager", "boundServiceAccountToken"}
    params = {}
    for ref in auth["spec"]["secretTargetRef"]:
        assert set(ref) == {"parameter", "name", "key"}, ref
        assert ref["parameter"] in KAFKA_AUTH_PARAMS, ref
        data = secret_data(obj("production", "Secret", ref["name"]))  # the hashed name
        assert ref["key"] in data, ref
        params[ref["parameter"]] = ref["key"]
    # the same credentials as the consumers'
    assert params["username"] == "SLUICE_KAFKA_SASL_USERNAME"
    assert params["password"] == "SLUICE_KAFKA_SASL_PASSWORD"


# ==== replicas, partitions, autoscaling ====

def consumer_threads(overlay):
    env = container_env(overlay, deployments(overlay)["sluice-consumer"])
    return int(effective(env, "SLUICE_CONSUMER_THREADS"))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_group_members_never_exceed_the_partitions(overlay):
    """Every delivery loop is a member of the consumer group and needs a partition of
    topic_deliveries; recorders split topic_outcomes (created with the same count)."""
    parts = partitions_for(overlay)
    deps = deployments(overlay)
    threads = consumer_threads(overlay)
    scaled = objs(overlay, "ScaledObject")
    if scaled:
        (so,) = scaled
        assert so["spec"]["maxReplicaCount"] * threads <= parts, (
            f"maxReplicaCount {so['spec']['maxReplicaCount']} x consumer_threads {threads} > "
            f"{parts} partitions")
    else:
        assert deps["sluice-consumer"]["spec"].get("replicas", 1) * threads <= parts
    assert deps["sluice-recorder"]["spec"].get("replicas", 1) <= parts


def test_production_max_replicas_is_stated_in_the_manifest_and_the_docs():
    n = production_partitions()
    so_text = read(os.path.join(K8S, "overlays", "production", "consumer-scaledobject.yaml"))
    assert f"sluicectl topics ensure --partitions {n}" in so_text
    k8s = docs_section("Kubernetes")
    assert "maxReplicaCount" in k8s and str(scaled_object()["spec"]["maxReplicaCount"]) in k8s
    assert re.search(r"KEDA\b.*must be installed", k8s, re.S)
    assert "kubectl apply -k ops/k8s/overlays/production" in k8s


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_autoscaled_deployments_leave_replicas_to_the_autoscaler(overlay):
    deps = deployments(overlay)
    targets = {so["spec"]["scaleTargetRef"]["name"] for so in objs(overlay, "ScaledObject")}
    for hpa in objs(overlay, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        assert ref["kind"] == "Deployment" and ref["name"] in deps
        targets.add(ref["name"])
        # utilization is of the requests: the target must have them
        (c,) = deps[ref["name"]]["spec"]["template"]["spec"]["containers"]
        assert "cpu" in c["resources"]["requests"]
        assert hpa["spec"]["minReplicas"] >= 2
    for name in targets:
        assert "replicas" not in deps[name]["spec"], (
            f"{name}: spec.replicas would fight the autoscaler at every apply")
    if overlay == "production":
        assert targets == {"sluice-consumer", "sluice-api"}


# ==== probes and shutdown ====

def port_of(container, port):
    for p in container.get("ports", []):
        if port in (p.get("name"), p["containerPort"]):
            return p["containerPort"]
    pytest.fail(f"{container['name']}: probe port {port!r} is not a port of the container")


def listen_port(value):
    host, _, port = value.rpartition(":")
    assert host not in ("127.0.0.1", "localhost", "[::1]"), f"{value}: the kubelet cannot reach it"
    return int(port)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_point_at_the_ports_the_processes_listen_on(overlay):
    for name, d in deployments(overlay).items():
        (c,) = d["spec"]["template"]["spec"]["containers"]
        env = container_env(overlay, d)
        # docs/OPERATIONS.md: consumer and recorder serve the probes on metrics_listen,
        # sluice-api on its own listener (api_listen)
        listen = "SLUICE_API_LISTEN" if name == "sluice-api" else "SLUICE_METRICS_LISTEN"
        want = listen_port(effective(env, listen))
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"),
                            ("startupProbe", "/healthz")):
            if probe == "startupProbe" and probe not in c:
                continue
            get = c[probe]["httpGet"]
            assert get["path"] == path, (name, probe)
            assert port_of(c, get["port"]) == want, (name, probe)
        # the readiness checks wait on Redis / PostgreSQL for up to redis_timeout_ms
        assert c["readinessProbe"]["timeoutSeconds"] * 1000 >= int(effective(env, "SLUICE_REDIS_TIMEOUT_MS"))
        # every process also serves /metrics on metrics_listen, a declared port
        assert port_of(c, "metrics") == listen_port(effective(env, "SLUICE_METRICS_LISTEN"))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grace_period_is_above_the_exit_bound(overlay):
    for name, d in deployments(overlay).items():
        pod = d["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        env = container_env(overlay, d)
        grace = pod["terminationGracePeriodSeconds"]
        pre = c.get("lifecycle", {}).get("preStop")
        pre_s = 0
        if pre:
            cmd = pre["exec"]["command"]
            assert cmd[0] == "sleep" and len(cmd) == 2, cmd
            pre_s = int(cmd[1])
        if name == "sluice-api":
            bound_ms = int(effective(env, "SLUICE_API_SHUTDOWN_MS"))
        else:  # shutdown_timeout_ms bounds the whole exit of consumer and recorder
            bound_ms = int(effective(env, "SLUICE_SHUTDOWN_TIMEOUT_MS"))
        assert grace * 1000 > pre_s * 1000 + bound_ms, (
            f"{name}: terminationGracePeriodSeconds {grace} <= preStop {pre_s} s + {bound_ms} ms")


def test_exit_bounds_are_the_documented_defaults():
    opts = config_options()
    assert opts["SLUICE_SHUTDOWN_TIMEOUT_MS"]["default"] == "25000"
    assert opts["SLUICE_API_SHUTDOWN_MS"]["default"] == "10000"


# ==== configuration and secrets ====

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_configmap_keys_are_documented_options_and_not_secrets(overlay):
    opts = config_options()
    for cm in objs(overlay, "ConfigMap"):
        for key, value in cm.get("data", {}).items():
            assert key in opts, f"{key} is not an option of docs/CONFIG.md"
            assert key not in secret_envs(), f"{key} belongs in the Secret"
            assert not re.search(r"password\s*=|://[^/@]*:[^/@]*@", value, re.I), key


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_only_through_secret_refs(overlay):
    configmaps = {cm["metadata"]["name"] for cm in objs(overlay, "ConfigMap")}
    for name, d in deployments(overlay).items():
        (c,) = d["spec"]["template"]["spec"]["containers"]
        for ef in c.get("envFrom", []):
            assert set(ef) <= {"configMapRef", "secretRef", "prefix"}
            if "configMapRef" in ef:
                assert ef["configMapRef"]["name"] in configmaps
        for e in c.get("env", []):
            if e["name"] in secret_envs():
                assert "secretKeyRef" in e.get("valueFrom", {}), f"{name}: {e['name']}"
            if "value" in e:
                assert not re.search(r"password|secret|key", e["name"], re.I), f"{name}: {e['name']}"
        env = container_env(overlay, d)
        assert "SLUICE_MASTER_KEY" in env, f"{name} needs the master key"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_committed_secret_values_are_placeholders(overlay):
    """No real key in the repository: the example master key is not even in a key's format,
    and every password is a visible placeholder."""
    path = os.path.join(K8S, "overlays", overlay, "secrets.env")
    values = dict(line.split("=", 1) for line in read(path).splitlines()
                  if line.strip() and not line.startswith("#"))
    key = values["SLUICE_MASTER_KEY"]
    assert "REPLACE_ME" in key
    for part in key.split(","):
        part = part.split(":", 1)[-1]
        assert not re.fullmatch(r"[0-9a-fA-F]{64}|[A-Za-z0-9+/_-]{43}=?", part), part
    for k, v in values.items():
        for pw in re.findall(r"password=(\S+)|://[^/@:]*:([^/@]+)@", v):
            assert "REPLACE_ME" in "".join(pw), k
        if k == "SLUICE_KAFKA_SASL_PASSWORD":
            assert "REPLACE_ME" in v
    # the rendered Secret carries exactly these
    (s,) = objs(overlay, "Secret")
    assert secret_data(s) == values


# ==== the real processes on the rendered configuration ====

@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("name", sorted(PROCESSES))
def test_process_accepts_the_rendered_environment(overlay, name):
    """Every SLUICE_* variable the pod gets is an option the process knows, and every value
    passes its checks (ranges, TLS and SASL combinations), as --check-config judges them. The
    placeholder master key is swapped for a throwaway one: that is what an operator does."""
    env = container_env(overlay, deployments(overlay)[name])
    env["SLUICE_MASTER_KEY"] = secrets.token_hex(32)
    r = run_process(PROCESSES[name][0], env, ["--check-config"])
    assert r.returncode == 0, f"{name} --check-config on overlays/{overlay}:\n{r.stderr}"


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("name", ["sluice-consumer", "sluice-api"])
def test_placeholder_master_key_is_refused_at_start(overlay, name):
    """Applied without replacing the example key, a pod exits 78 (docs/OPERATIONS.md: the
    master key is required by consumers and sluice-api) instead of running with a known key.
    The services point at a closed local port: nothing is reached even if the check moved."""
    env = container_env(overlay, deployments(overlay)[name])
    assert "REPLACE_ME" in env["SLUICE_MASTER_KEY"]
    env.update({"SLUICE_KAFKA_BROKERS": "127.0.0.1:1", "SLUICE_REDIS_URL": "redis://127.0.0.1:1",
                "SLUICE_PG_DSN": "host=127.0.0.1 port=1 dbname=x user=x connect_timeout=1",
                "SLUICE_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT"})
    env.pop("SLUICE_KAFKA_SASL_USERNAME", None)
    env.pop("SLUICE_KAFKA_SASL_PASSWORD", None)
    env.pop("SLUICE_KAFKA_SASL_MECHANISM", None)
    env.pop("SLUICE_METRICS_LISTEN", None)
    env.pop("SLUICE_API_LISTEN", None)
    # The exit code is what counts here; an ASan build's leak report on this early exit would
    # replace it (leaks are the other suites' business).
    if "ASAN_OPTIONS" in os.environ:
        env["ASAN_OPTIONS"] = os.environ["ASAN_OPTIONS"] + ":detect_leaks=0"
    try:
        r = run_process(PROCESSES[name][0], env, [], timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} started with the placeholder master key")
    assert r.returncode == 78, r.stderr
    assert "master_key" in r.stderr
    assert env["SLUICE_MASTER_KEY"] not in r.stderr  # a secret, even a fake one, is not echoed


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_links_are_off_because_the_processes_refuse_them(overlay):
    """A Service named sluice-api makes the kubelet add SLUICE_API_PORT, SLUICE_API_SERVICE_HOST,
    ... to every pod of the namespace, unless enableServiceLinks is false; the processes refuse
    unknown SLUICE_* variables."""
    for name, d in deployments(overlay).items():
        assert d["spec"]["template"]["spec"].get("enableServiceLinks") is False, name
    links = service_link_env(overlay)
    assert any(k.startswith("SLUICE_") for k in links)
    env = container_env(overlay, deployments(overlay)["sluice-consumer"], links=True)
    env["SLUICE_MASTER_KEY"] = secrets.token_hex(32)
    r = run_process(PROCESSES["sluice-consumer"][0], env, ["--check-config"])
    assert r.returncode == 78 and "unknown environment variable SLUICE_" in r.stderr, r.stderr


# ==== pod hardening, disruption, resources, images ====

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_run_restricted(overlay):
    (ns,) = objs(overlay, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for name, d in deployments(overlay).items():
        pod = d["spec"]["template"]["spec"]
        psc = pod["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0 and psc["runAsGroup"] > 0
        assert psc["seccompProfile"]["type"] == "RuntimeDefault"
        assert pod["automountServiceAccountToken"] is False
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
            assert not sc.get("privileged")
        for v in pod.get("volumes", []):
            assert set(v) <= {"name", "secret", "configMap", "emptyDir", "projected"}, v


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_disruption_budget_per_deployment(overlay):
    pdbs = objs(overlay, "PodDisruptionBudget")
    for name, d in deployments(overlay).items():
        labels = d["spec"]["template"]["metadata"]["labels"]
        mine = [p for p in pdbs
                if all(labels.get(k) == v for k, v in p["spec"]["selector"]["matchLabels"].items())]
        assert len(mine) == 1, f"{name}: {len(mine)} PodDisruptionBudgets"
        spec = mine[0]["spec"]
        # one pod at a time (every consumer that leaves is a rebalance), and never a budget
        # that forbids draining a node with a single replica
        assert spec.get("maxUnavailable") == 1 and "minAvailable" not in spec, spec


def quantity(q):
    q = str(q)
    units = {"m": 1e-3, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30}
    for u, f in units.items():
        if q.endswith(u):
            return float(q[: -len(u)]) * f
    return float(q)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_resources_are_set_from_the_cited_measurements(overlay):
    for name, d in deployments(overlay).items():
        (c,) = d["spec"]["template"]["spec"]["containers"]
        res = c["resources"]
        for kind in ("cpu", "memory"):
            assert quantity(res["requests"][kind]) <= quantity(res["limits"][kind]), (name, kind)
    # each figure's source exists
    for f in ("consumer.yaml", "recorder.yaml", "api.yaml"):
        cited = re.findall(r"bench/results/([\w.-]+\.(?:json|txt))", read(os.path.join(K8S, "base", f)))
        assert cited, f"{f} cites no measurement"
        for c in cited:
            assert os.path.exists(os.path.join(REPO, "bench", "results", c)), c
    # the consumer's memory limit holds the measured peak at 10,000 in flight (above the
    # default max_inflight + max_queued), its CPU limit its delivery loops
    run8 = json.loads(read(os.path.join(REPO, "bench", "results", "2026-12-01-vm-run8.json")))
    peak = run8["phases"]["rss"]["consumer_hwm_kb"] * 1024
    assert run8["phases"]["rss"]["consumer_peak_inflight"] == 10000
    (c,) = deployments(overlay)["sluice-consumer"]["spec"]["template"]["spec"]["containers"]
    assert quantity(c["resources"]["limits"]["memory"]) >= 1.2 * peak
    assert quantity(c["resources"]["limits"]["cpu"]) >= consumer_threads(overlay)
    (a,) = deployments(overlay)["sluice-api"]["spec"]["template"]["spec"]["containers"]
    env = container_env(overlay, deployments(overlay)["sluice-api"])
    assert quantity(a["resources"]["limits"]["cpu"]) >= int(effective(env, "SLUICE_API_THREADS"))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_image_for_every_process(overlay):
    images = set()
    for name, d in deployments(overlay).items():
        (c,) = d["spec"]["template"]["spec"]["containers"]
        images.add(c["image"])
        assert c["command"] == [name], name  # the Dockerfile installs every binary on PATH
    assert len(images) == 1, images
    image = images.pop()
    assert not image.endswith(":latest") and (":" in image.rsplit("/", 1)[-1] or "@" in image)
    if overlay == "dev":
        assert image == "sluice:dev"  # compose.yaml's image name


# ==== metrics ====

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_metrics_port_is_scrapeable_and_never_public(overlay):
    services = objs(overlay, "Service")
    for name, d in deployments(overlay).items():
        tmpl = d["spec"]["template"]
        (c,) = tmpl["spec"]["containers"]
        metrics = port_of(c, "metrics")
        ann = tmpl["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/path"] == "/metrics"
        assert int(ann["prometheus.io/port"]) == metrics
        labels = tmpl["metadata"]["labels"]
        selecting = [s for s in services
                     if all(labels.get(k) == v for k, v in s["spec"]["selector"].items())]
        headless = [s for s in selecting if s["spec"].get("clusterIP") == "None"]
        assert len(headless) == 1, f"{name}: one headless metrics Service"
        (p,) = headless[0]["spec"]["ports"]
        assert port_of(c, p["targetPort"]) == metrics and p["port"] == metrics
        for s in selecting:
            if s["spec"].get("clusterIP") != "None":  # a Service clients reach
                for p in s["spec"]["ports"]:
                    assert port_of(c, p["targetPort"]) != metrics, f"{s['metadata']['name']} exposes /metrics"


def test_scrape_jobs_name_the_metrics_services():
    """ops/k8s/prometheus-scrape.yml: one job per process, through the production overlay's
    headless Services, labelled `process` as ops/prometheus/prometheus.yml labels them."""
    conf = yaml.safe_load(read(os.path.join(K8S, "prometheus-scrape.yml")))
    compose_jobs = {j["job_name"]: j for j in yaml.safe_load(
        read(os.path.join(REPO, "ops", "prometheus", "prometheus.yml")))["scrape_configs"]}
    (ns,) = objs("production", "Namespace")
    services = {s["metadata"]["name"]: s for s in objs("production", "Service")}
    deps = deployments("production")
    jobs = {j["job_name"]: j for j in conf["scrape_configs"]}
    assert set(jobs) == set(PROCESSES) == set(compose_jobs)
    for name, job in jobs.items():
        (sd,) = job["dns_sd_configs"]
        (dns,) = sd["names"]
        svc_name, svc_ns, rest = dns.split(".", 2)
        assert svc_ns == ns["metadata"]["name"] and rest == "svc"
        svc = services[svc_name]
        assert svc["spec"]["clusterIP"] == "None"
        assert sd["port"] == svc["spec"]["ports"][0]["port"]
        component = deps[name]["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        assert component == PROCESSES[name][1]
        assert job["relabel_configs"] == compose_jobs[name]["relabel_configs"]
        # the process's own name (its sluice_build_info label), the job's name
        assert job["relabel_configs"][0]["replacement"] == name
