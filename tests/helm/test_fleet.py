"""The chart deploys a fleet that can run: every worker container's image is one the Dockerfile
builds with the `worker` extra (torch), a GPU pool's the CUDA variant; each pool is scheduled
by its own resources, GPUs, node selection and spread; its PodDisruptionBudget protects a
baseline pool and never holds an opportunistic one; bad values fail naming the key.

The images are traced from the rendered manifests to infra/docker/images.sh (which tag is built
from which Dockerfile target) and through the Dockerfile's stages (what each RUN installs and
uninstalls, requirements.py evaluated as the build evaluates it).
"""

from __future__ import annotations

import copy
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.test_chart import CHART, ROOT, _helm, _of

Rendered = tuple[dict[str, Any], list[dict[str, Any]]]    # merged values, manifests

pytestmark = pytest.mark.helm

DOCKERFILE = ROOT / "infra" / "docker" / "Dockerfile"
IMAGES_SH = ROOT / "infra" / "docker" / "images.sh"
VALUES = {"defaults": None, "everything": CHART / "ci" / "everything-values.yaml"}
GPU = "nvidia.com/gpu"

sys.path.insert(0, str(ROOT / "infra" / "docker"))
import requirements as image_requirements  # noqa: E402  (infra/docker/requirements.py)

sys.path.pop(0)


# --- what each Dockerfile target installs ------------------------------------------------------

def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pyproject() -> dict[str, Any]:
    import tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _stages() -> dict[str, tuple[str, list[str]]]:
    """Stage name -> (its base, its RUN commands), continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: dict[str, tuple[str, list[str]]] = {}
    current: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if m := re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)", line, re.IGNORECASE):
            current = []
            stages[m.group(2)] = (m.group(1), current)
        elif line.upper().startswith("RUN "):
            current.append(line[4:])
    return stages


def _expand_requirements(command: str) -> str:
    """$(python3 .../requirements.py PYPROJECT EXTRAS [--without ...] [| grep 'RE']) -> names."""
    def names(m: re.Match[str]) -> str:
        args = m.group(1).split()[1:]            # after the pyproject path
        without: set[str] = set()
        if "--without" in args:
            i = args.index("--without")
            without, args = {a.lower() for a in args[i + 1:]}, args[:i]
        found = image_requirements.requirements(_pyproject(), args, without)
        if m.group(2):
            found = [r for r in found if re.search(m.group(2), r)]
        return " ".join(_name(r) for r in found)
    return re.sub(r"\$\(python3 /tmp/build/requirements\.py ([^)|]*?)(?:\|\s*grep '([^']*)')?\s*\)",
                  names, command)


def _pip_names(segment: str) -> list[str]:
    """The packages a `pip install|uninstall ...` names (options and their arguments dropped)."""
    tokens = segment.split()[2:]
    out: list[str] = []
    skip = False
    for token in tokens:
        if skip:
            skip = False
        elif token in ("-c", "--constraint", "-r", "--requirement", "--target", "-t"):
            skip = True
        elif token == "/src":
            out.append("surplus")
        elif not token.startswith("-"):
            out.append(_name(token))
    return out


def target_packages(target: str) -> tuple[set[str], set[str]]:
    """(installed, removed) after every stage up to `target`: removed are the names a RUN
    uninstalled that no later RUN put back."""
    stages = _stages()
    chain: list[str] = []
    while target in stages:
        chain.insert(0, target)
        target = stages[target][0]
    installed: set[str] = set()
    removed: set[str] = set()
    for stage in chain:
        for command in stages[stage][1]:
            for segment in _expand_requirements(command).split("&&"):
                segment = segment.strip()
                if segment.startswith("pip install"):
                    names = set(_pip_names(segment))
                    installed |= names
                    removed -= names
                elif segment.startswith("pip uninstall"):
                    names = set(_pip_names(segment))
                    installed -= names
                    removed |= names
    return installed, removed


def built_targets() -> dict[str, str]:
    """Image repository -> the Dockerfile target images.sh builds it from."""
    found = re.findall(r'^\s*build\s+"?([\w.-]+):\S+.*--target\s+([\w-]+)', IMAGES_SH.read_text(),
                       re.MULTILINE)
    return dict(found)


def _repository(image: str) -> str:
    name = image.rsplit("/", 1)[-1]
    return name.split(":", 1)[0]


WORKER_EXTRA = {_name(r) for r in image_requirements.requirements(_pyproject(), ["worker"], set())}


def image_problem(image: str, gpus: int) -> str | None:
    """Why `image` cannot run a worker (with `gpus` GPUs), or None."""
    target = built_targets().get(_repository(image))
    if target is None:
        return f"{image}: no Dockerfile target builds it (infra/docker/images.sh)"
    installed, removed = target_packages(target)
    missing = (WORKER_EXTRA | {"surplus"}) - installed
    if missing:
        return f"{image}: target {target} lacks the worker extra's {sorted(missing)}"
    if gpus and removed:
        return f"{image}: target {target} strips {sorted(removed)}, which a GPU loads"
    return None


# --- rendering ---------------------------------------------------------------------------------

def _render(values: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [_helm(), "template", "surplus", str(CHART), "--kube-version", "1.33.0", *args]
    if values is not None:
        argv += ["--values", str(values)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _manifests(values: Path | None, *args: str) -> list[dict[str, Any]]:
    done = _render(values, *args)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _merge(base: Any, over: Any) -> Any:
    """Helm's merge of values files: maps merge, a null deletes, anything else replaces."""
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return copy.deepcopy(over)
    out = copy.deepcopy(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value) if key in out else copy.deepcopy(value)
    return out


def _values(values: Path | None) -> dict[str, Any]:
    merged = yaml.safe_load((CHART / "values.yaml").read_text())
    if values is not None:
        merged = _merge(merged, yaml.safe_load(values.read_text()))
    return merged


@pytest.fixture(params=sorted(VALUES), scope="module")
def rendered(request: pytest.FixtureRequest) -> Rendered:
    path = VALUES[request.param]
    return _values(path), _manifests(path)


def _pools(values: dict[str, Any], manifests: list[dict[str, Any]]
           ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(values' pool entry, its Deployment) for every pool."""
    deployments = {d["metadata"]["name"]: d for d in _of(manifests, "Deployment")}
    out = []
    for pool in values["workers"]["pools"]:
        (name,) = [n for n in deployments if n.endswith(f"-worker-{pool['name']}")]
        out.append((pool, deployments.pop(name)))
    assert not deployments, f"Deployments of no pool: {sorted(deployments)}"
    return out


def _own(values: dict[str, Any], pool: dict[str, Any], key: str) -> Any:
    return pool[key] if key in pool else values["workers"].get(key)


def _worker(deployment: dict[str, Any]) -> dict[str, Any]:
    (worker,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "worker"]
    return worker


def _gpus(container: dict[str, Any]) -> int:
    return int((container["resources"].get("limits") or {}).get(GPU, 0))


# --- images ------------------------------------------------------------------------------------

def test_the_image_check_tells_torch_from_none() -> None:
    """The checks below mean something: `app` (no torch) fails them, `worker` passes on a CPU
    only, `worker-cuda` passes on a GPU too."""
    built = built_targets()
    assert built["surplus"] == "app" and built["surplus-worker"] == "worker"
    assert built["surplus-worker-cuda"] == "worker-cuda"
    app_installed, _ = target_packages("app")
    assert "torch" not in app_installed and "faust-streaming" in app_installed
    assert "torch" in image_problem("surplus:1", 0)  # type: ignore[operator]
    assert image_problem("surplus-worker:1", 0) is None
    assert "triton" in image_problem("surplus-worker:1", 1)  # type: ignore[operator]
    assert image_problem("registry.example.com:5000/x/surplus-worker-cuda:1", 1) is None


def test_every_worker_runs_an_image_with_torch(rendered: Rendered) -> None:
    _, manifests = rendered
    deployments = _of(manifests, "Deployment")
    assert deployments
    for deployment in deployments:
        worker = _worker(deployment)
        assert image_problem(worker["image"], _gpus(worker)) is None
    for kind in ("StatefulSet", "Job"):        # and the rest run an image that is built
        for m in _of(manifests, kind):
            for c in m["spec"]["template"]["spec"]["containers"]:
                assert _repository(c["image"]) in built_targets(), c["image"]


@pytest.mark.parametrize(("args", "wrong"), [
    (("--set", "workers.image.repository.cpu=surplus"), "lacks the worker extra's ['torch']"),
    (("--set", "workers.image.variant=cpu", "--set-json",
      'workers.pools=[{"name":"g","pool":"eu1/rank/powerful/h100/opportunistic","replicas":1,"gpus":1}]'),
     "strips"),
])
def test_a_worker_on_an_image_without_torch_is_caught(args: tuple[str, ...], wrong: str) -> None:
    problems = [image_problem(_worker(d)["image"], _gpus(_worker(d)))
                for d in _of(_manifests(None, *args), "Deployment")]
    assert any(p and wrong in p for p in problems), problems


@pytest.mark.parametrize(("variant", "gpus", "repository"), [
    ("auto", 0, "surplus-worker"), ("auto", 2, "surplus-worker-cuda"),
    ("cuda", 0, "surplus-worker-cuda"), ("cpu", 0, "surplus-worker")])
def test_the_image_variant(variant: str, gpus: int, repository: str) -> None:
    accelerator = "h100" if gpus else "cpu"
    pools = [{"name": "p", "pool": f"eu1/rank/powerful/{accelerator}/opportunistic",
              "replicas": 1, "gpus": gpus}]
    (deployment,) = _of(_manifests(None, "--set", f"workers.image.variant={variant}",
                                   "--set-string", "workers.image.tag=7", "--set-json",
                                   f"workers.pools={json.dumps(pools)}"), "Deployment")
    assert _worker(deployment)["image"] == f"{repository}:7"


# --- scheduling --------------------------------------------------------------------------------

def test_each_pool_gets_its_gpus_resources_and_placement(
        rendered: Rendered) -> None:
    values, manifests = rendered
    w = values["workers"]
    for pool, deployment in _pools(values, manifests):
        pod = deployment["spec"]["template"]["spec"]
        worker = _worker(deployment)
        gpus = int(pool.get("gpus") or 0)
        accelerator = pool["pool"].split("/")[3]
        assert (gpus > 0) <= (accelerator != "cpu")
        resources = worker["resources"]
        for side in ("requests", "limits"):
            expected = dict((_own(values, pool, "resources") or {}).get(side) or {})
            if gpus:
                expected[GPU] = gpus        # asked for and limited to the same count
            assert (resources.get(side) or {}) == expected, (pool["name"], side)
        assert pod.get("nodeSelector", {}) == (_own(values, pool, "nodeSelector") or {})
        assert pod.get("affinity", {}) == (_own(values, pool, "affinity") or {})
        tolerations = list(_own(values, pool, "tolerations") or [])
        if gpus:
            tolerations += w["gpuTolerations"]
        assert pod.get("tolerations", []) == tolerations


def test_gpu_pools_ask_for_gpus(rendered: Rendered) -> None:
    values, manifests = rendered
    for pool, deployment in _pools(values, manifests):
        accelerator = pool["pool"].split("/")[3]
        resources = _worker(deployment)["resources"]
        if accelerator == "cpu":
            assert GPU not in (resources.get("limits") or {})
        elif pool["gpus"]:
            assert resources["requests"][GPU] == resources["limits"][GPU] == pool["gpus"]


def test_replicas_spread_within_their_pool(rendered: Rendered) -> None:
    values, manifests = rendered
    spread_somewhere = False
    for pool, deployment in _pools(values, manifests):
        selector = deployment["spec"]["selector"]["matchLabels"]
        constraints = deployment["spec"]["template"]["spec"].get("topologySpreadConstraints", [])
        expected = _own(values, pool, "topologySpreadConstraints") or []
        assert [c["topologyKey"] for c in constraints] == [c["topologyKey"] for c in expected]
        for constraint, wanted in zip(constraints, expected, strict=True):
            spread_somewhere = True
            assert constraint["labelSelector"] == {"matchLabels": selector}
            assert constraint["matchLabelKeys"] == ["pod-template-hash"]
            assert constraint["maxSkew"] == wanted["maxSkew"]
            assert constraint["whenUnsatisfiable"] == wanted["whenUnsatisfiable"]
    assert spread_somewhere


# --- disruption budgets ------------------------------------------------------------------------

def _allowed(spec: dict[str, Any], replicas: int) -> int:
    """Evictions a budget allows with every replica healthy (percentages round up)."""
    def count(value: int | str) -> int:
        if isinstance(value, str) and value.endswith("%"):
            return math.ceil(replicas * int(value[:-1]) / 100)
        return int(value)
    if "maxUnavailable" in spec:
        return min(replicas, count(spec["maxUnavailable"]))
    return max(0, replicas - count(spec["minAvailable"]))


def _budgets(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {b["metadata"]["name"]: b for b in _of(manifests, "PodDisruptionBudget")}


def test_baseline_pools_are_protected_and_opportunistic_ones_never_held(
        rendered: Rendered) -> None:
    values, manifests = rendered
    budgets = _budgets(manifests)
    for pool, deployment in _pools(values, manifests):
        tier = pool["pool"].split("/")[4]
        spec = pool["podDisruptionBudget"] if "podDisruptionBudget" in pool \
            else values["workers"]["podDisruptionBudget"][tier]
        budget = budgets.pop(deployment["metadata"]["name"], None)
        if spec is None:
            assert budget is None
            continue
        assert budget is not None, deployment["metadata"]["name"]
        assert budget["spec"]["selector"] == deployment["spec"]["selector"]
        replicas = deployment["spec"]["replicas"]
        allowed = _allowed(budget["spec"], replicas)
        if tier == "opportunistic":
            assert allowed == replicas          # a drain never waits on optional work
        else:
            assert allowed < replicas           # never every baseline replica at once
            assert allowed >= 1 or replicas < 2  # and a drain can always proceed
    (control,) = budgets.values()               # the rest: the control plane's
    (statefulset,) = _of(manifests, "StatefulSet")
    assert control["spec"]["selector"] == statefulset["spec"]["selector"]
    assert 1 <= _allowed(control["spec"], statefulset["spec"]["replicas"]) < \
        statefulset["spec"]["replicas"]


def test_the_default_budgets() -> None:
    values = _values(None)["workers"]["podDisruptionBudget"]
    assert values["baseline"] == {"maxUnavailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow"}
    assert values["opportunistic"] == {"maxUnavailable": "100%"}


def test_each_budget_selects_only_its_pools_pods() -> None:
    manifests = _manifests(VALUES["everything"])
    pods = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
            for kind in ("Deployment", "StatefulSet") for d in _of(manifests, kind)}
    for name, budget in _budgets(manifests).items():
        wanted = budget["spec"]["selector"]["matchLabels"]
        assert [p for p, labels in pods.items() if wanted.items() <= labels.items()] == [name]


# --- bad values --------------------------------------------------------------------------------

ONE_POOL = 'workers.pools=[{"name":"g","pool":"eu1/rank/powerful/%s/opportunistic","replicas":1%s}]'


@pytest.mark.parametrize(("args", "message"), [
    (("--set", "workers.image.variant=gpu"), "/workers/image/variant"),
    (("--set-json", ONE_POOL % ("h100", "")), "workers.pools[0].gpus"),
    (("--set-json", ONE_POOL % ("cpu", ',"gpus":1')), "workers.pools[0].gpus"),
    (("--set-json", ONE_POOL % ("cpu", ',"resources":{"limits":{"nvidia.com/gpu":1}}')),
     "workers.pools[0].resources.limits"),
    (("--set-json", ONE_POOL % ("cpu", ',"nodeselector":{}')), "'nodeselector' not allowed"),
    (("--set-json", ONE_POOL % ("cpu", ',"imageVariant":"rocm"')), "/workers/pools/0/imageVariant"),
    (("--set-json", ONE_POOL.replace("/opportunistic", "/spare") % ("cpu", "")),
     "/workers/pools/0/pool"),
    (("--set", "workers.podDisruptionBudget.baseline.minAvailable=1"),
     "workers.podDisruptionBudget.baseline"),
    (("--set", "controlPlane.podDisruptionBudget.maxUnavailable=half"),
     "/controlPlane/podDisruptionBudget/maxUnavailable"),
    (("--set-json", 'workers.topologySpreadConstraints=[{"topologyKey":"x","maxSkew":0,'
                    '"whenUnsatisfiable":"ScheduleAnyway"}]'),
     "/workers/topologySpreadConstraints/0/maxSkew"),
])
def test_bad_values_fail_naming_the_key(args: tuple[str, ...], message: str) -> None:
    done = _render(None, *args)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
