"""The deployment files: ``Dockerfile`` and ``deploy/kubernetes.yaml``.

The manifests are validated against the Kubernetes OpenAPI schemas that kubernetes-validate
ships in its package (no download), strictly (unknown fields are errors); then checked for
what serving needs: one GPU, probes on ``/health`` at the server's port, the model folder from
a volume, a Service reaching the pods. The Dockerfile is parsed (dockerfile-parse) for its base
image, extras, entrypoint, port and health check.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path

import dockerfile_parse
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "deploy" / "kubernetes.yaml"
PORT = 8000
#: the oldest Kubernetes the manifests are checked against, and the package's newest
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())


def _docs() -> list[dict]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def _kind(kind: str) -> dict:
    (doc,) = [d for d in _docs() if d["kind"] == kind]
    return doc


def _container() -> dict:
    (c,) = _kind("Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def _port_number(container: dict, port: int | str) -> int:
    """A probe's or Service's port: a number, or the name of a container port."""
    if isinstance(port, int):
        return port
    (p,) = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    return p


@pytest.mark.parametrize("version", VERSIONS)
def test_manifests_validate_against_the_kubernetes_schema(version):
    docs = _docs()
    assert sorted(d["kind"] for d in docs) == ["Deployment", "PersistentVolumeClaim", "Service"]
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_rejects_broken_manifests():
    """The schema check is real: a wrong type and an unknown field (strict) are refused."""
    bad = copy.deepcopy(_kind("Deployment"))
    bad["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[0], strict=True)
    bad = copy.deepcopy(_kind("Deployment"))
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[0], strict=True)


def test_deployment_serves_on_one_gpu_with_health_probes():
    dep = _kind("Deployment")
    c = _container()
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert [p["containerPort"] for p in c["ports"]] == [PORT]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/health" and _port_number(c, get["port"]) == PORT, probe
    # the model folder is on a mounted volume backed by the claim defined in the file
    model = c["args"][c["args"].index("--model") + 1]
    (mount,) = [m for m in c["volumeMounts"] if model.startswith(m["mountPath"].rstrip("/") + "/")]
    (vol,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    assert vol["persistentVolumeClaim"]["claimName"] == _kind("PersistentVolumeClaim")["metadata"]["name"]
    assert c["args"][c["args"].index("--port") + 1] == str(PORT) and c["args"][c["args"].index("--host") + 1] == "0.0.0.0"
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_service_reaches_the_pods():
    svc = _kind("Service")
    labels = _kind("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    (port,) = svc["spec"]["ports"]
    assert port["port"] == PORT and _port_number(_container(), port["targetPort"]) == PORT


def _dockerfile() -> dockerfile_parse.DockerfileParser:
    return dockerfile_parse.DockerfileParser(path=str(ROOT / "Dockerfile"))


def _instructions(name: str) -> list[str]:
    return [i["value"] for i in _dockerfile().structure if i["instruction"] == name]


def test_dockerfile_essentials():
    df = _dockerfile()
    assert re.fullmatch(r"nvidia/cuda:13\.\d+\.\d+-runtime-ubuntu24\.04", df.baseimage), df.baseimage
    (entry,) = _instructions("ENTRYPOINT")
    entry = json.loads(entry)  # exec form: signals (SIGTERM drains) reach the server, no shell between
    assert entry[:2] == ["trtcore", "serve"]
    assert entry[entry.index("--host") + 1] == "0.0.0.0" and entry[entry.index("--port") + 1] == str(PORT)
    assert _instructions("EXPOSE") == [str(PORT)]
    (health,) = _instructions("HEALTHCHECK")
    assert f"127.0.0.1:{PORT}/health" in health and "--start-period" in health


def test_dockerfile_installs_the_package_with_its_gpu_extras():
    """pip installs extras that exist (trt, gpu, serve) from sources the image copied: every
    package folder of pyproject.toml, and the readme it names."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    installs = [v for v in _instructions("RUN") if "pip install" in v]
    (line,) = installs
    (spec,) = re.findall(r'"\.\[([^\]]+)\]"', line)
    wanted = spec.split(",")
    assert {"trt", "gpu", "serve"} <= set(wanted) and set(wanted) <= set(extras)
    copied = {part for v in _instructions("COPY") for part in v.split()[:-1]}
    folders = set(project["tool"]["setuptools"]["package-dir"].values())
    assert folders | {"pyproject.toml", project["project"]["readme"]} <= copied
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip() and not line.startswith("#")}
    assert not ignored & copied


def test_entrypoint_and_manifest_args_parse_with_trtcore_serve():
    """The image's entrypoint plus the Deployment's args are a valid ``trtcore serve`` command
    line (skipped until the server's subcommand exists)."""
    from trtcore.cli import _parser

    parser = _parser()
    commands = next(a for a in parser._subparsers._group_actions if a.dest == "command").choices  # type: ignore[union-attr]
    if "serve" not in commands:
        pytest.skip("trtcore serve is not in this checkout")
    (entry,) = _instructions("ENTRYPOINT")
    args = parser.parse_args([*json.loads(entry)[1:], *_container()["args"]])
    assert args.command == "serve" and args.port == PORT and args.host == "0.0.0.0" and args.model == "/models/model"
