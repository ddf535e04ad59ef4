"""What one replica lends, from what its platform says (pure: the agent reads, this decides).

A capacity agent beside an opportunistic replica announces the replica's share of a pool. Who
it is and how much it holds are the platform's to say, not a configuration's, so that what the
control plane plans on is what the replica really has:

- **the pool** ``region/service/model/accelerator/tier``. ``service`` and ``model`` are what
  the worker serves (the agent's flags, as the worker's). The rest, unless given:
  the region from a ``topology.kubernetes.io/region`` label or the EC2 metadata's
  ``placement/region``; the accelerator type from a GPU-product label (``nvidia.com/gpu.
  product``, GKE's ``cloud.google.com/gke-accelerator``, Karpenter's ``instance-gpu-name``),
  else from the instance type (label ``node.kubernetes.io/instance-type`` or the metadata's
  ``instance-type``: ``g5.*`` -> ``a10g``, ``p4d.*`` -> ``a100`` ...), else ``cpu`` where no GPU
  is visible; the tier ``opportunistic`` on a spot or preemptible machine (the metadata's
  ``instance-life-cycle: spot``, or Karpenter's, EKS's, GKE's or AKS's spot label) and
  ``baseline`` otherwise. A ``surplus.io/<part>`` label names a part outright. Only an
  opportunistic replica lends: a baseline one is provisioned capacity, never lent.
- **CPU units**: the cores of the tightest CPU quota over its cgroup and the cgroups above it
  (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``), or the CPUs it
  may run on where no quota binds. A sidecar reads the worker's cgroup where it shares the
  worker's processes (``/proc/<pid>/root/sys/fs/cgroup``), or is handed the worker
  container's CPU limit by the Kubernetes downward API, the figure the kubelet writes there.
- **Accelerator units**: the GPUs it sees (``/dev/nvidia<N>``, narrowed by
  ``NVIDIA_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES``), counted without CUDA. A replica of
  accelerator type ``cpu`` is one unit, as the scheduler and the cost model count it (a unit's
  measured rate is one replica's).

Configured numbers are only priors and caps: ``cpu_units`` and ``accelerator_units`` cap what
is measured, and ``accelerator_units`` stands in for the count where no GPU is visible (a
sidecar container does not see the GPUs the device plugin gave the worker beside it).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping

import msgspec

from workers.capacity.cgroup import Quota

#: Labels (pod labels or annotations, or node labels copied onto the pod) that say a part of
#: the pool outright; they win over what is inferred.
OWN_LABELS = {"region": "surplus.io/region", "accelerator": "surplus.io/accelerator",
              "tier": "surplus.io/tier"}
REGION_LABELS = ("topology.kubernetes.io/region", "failure-domain.beta.kubernetes.io/region")
GPU_LABELS = ("nvidia.com/gpu.product", "cloud.google.com/gke-accelerator",
              "karpenter.k8s.aws/instance-gpu-name")
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
#: (label, value) pairs that mark a spot or preemptible node (value compared case-blind).
SPOT_LABELS = (("karpenter.sh/capacity-type", "spot"), ("eks.amazonaws.com/capacitytype", "spot"),
               ("cloud.google.com/gke-spot", "true"),
               ("cloud.google.com/gke-preemptible", "true"),
               ("kubernetes.azure.com/scalesetpriority", "spot"))
#: GPU models by the token that names them in a product string, most specific first (``a10g``
#: before ``a10``, ``l40s`` before ``l4``).
GPU_MODELS = ("gb200", "b200", "h200", "h100", "a100", "a10g", "a10", "l40s", "l40", "l4", "t4",
              "v100", "p100")
#: Instance families whose type names their accelerator (EC2; GCE's accelerator-optimised
#: machine series). Any other family is read as no accelerator, which the devices confirm.
FAMILY_ACCELERATORS = {
    "p5en": "h200", "p5e": "h200", "p5": "h100", "p4de": "a100", "p4d": "a100", "p3dn": "v100",
    "p3": "v100", "g6e": "l40s", "g6": "l4", "gr6": "l4", "g5": "a10g", "g4dn": "t4",
    "a3": "h100", "a2": "a100", "g2": "l4",
}


class PlatformError(ValueError):
    """What the platform says does not make a pool; the message names the setting to give."""


class Identity(msgspec.Struct, frozen=True, kw_only=True):
    """The pool a replica belongs to, each part as given or as the platform says it."""

    region: str
    service: str
    model: str
    accelerator: str
    tier: str

    @property
    def pool_id(self) -> str:
        return f"{self.region}/{self.service}/{self.model}/{self.accelerator}/{self.tier}"

    @property
    def lends(self) -> bool:
        """Only opportunistic capacity is lent; a baseline replica is provisioned."""
        return self.tier == "opportunistic"


class Wanted(msgspec.Struct, frozen=True, kw_only=True):
    """What the operator gave: parts of the pool (None: the platform's to say), and the
    configured units, which only cap what is measured or stand in where nothing is."""

    service: str = "rank"
    model: str = "baseline"
    region: str | None = None
    accelerator: str | None = None
    tier: str | None = None
    accelerator_units: float | None = None
    cpu_units: float | None = None

    @classmethod
    def from_pool(cls, pool_id: str, **units: float | None) -> Wanted:
        """Every part from a pool id ``region/service/model/accelerator/tier``."""
        parts = pool_id.split("/")
        if len(parts) != 5 or not all(parts):
            raise PlatformError(f"pool id {pool_id!r} is not region/service/model/accelerator/"
                                "tier")
        region, service, model, accelerator, tier = parts
        return cls(service=service, model=model, region=region, accelerator=accelerator,
                   tier=tier, **units)


class View(msgspec.Struct, frozen=True, kw_only=True):
    """What the agent read of its platform (None or empty: not known here)."""

    labels: Mapping[str, str] = {}
    instance_type: str | None = None
    lifecycle: str | None = None
    """EC2 ``instance-life-cycle``: ``spot``, ``on-demand`` or ``scheduled``."""
    cloud_region: str | None = None
    quota: Quota | None = None
    """The tightest CPU quota over the agent's cgroup and those above it (None: none binds)."""
    quota_source: str = "cgroup quota"
    cpus: int = 1
    """CPUs the process may run on (its affinity), the bound where no quota binds."""
    gpus: int = 0


class Share(msgspec.Struct, frozen=True, kw_only=True):
    """What a replica lends: its pool and its units, with where each figure came from."""

    identity: Identity
    accelerator_units: float
    cpu_units: float
    sources: dict[str, str] = {}

    @property
    def pool_id(self) -> str:
        return self.identity.pool_id


def identify(wanted: Wanted, view: View) -> Identity:
    """The replica's pool; PlatformError names the setting to give when a part is unknown."""
    labels = {k.lower(): v for k, v in view.labels.items()}
    region = (wanted.region or labels.get(OWN_LABELS["region"])
              or next((labels[k] for k in REGION_LABELS if labels.get(k)), None)
              or view.cloud_region)
    if not region:
        raise PlatformError("no region: give --region (or --pool), a topology.kubernetes.io/"
                            "region label, or run on EC2 with --source aws")
    accelerator = (wanted.accelerator or labels.get(OWN_LABELS["accelerator"])
                   or accelerator_of(labels, view.instance_type))
    if accelerator is None:
        if view.gpus:
            raise PlatformError(f"{view.gpus} GPU(s) visible but their type is unknown: give "
                                "--accelerator (or --pool), or a nvidia.com/gpu.product label")
        accelerator = "cpu"
    tier = wanted.tier or labels.get(OWN_LABELS["tier"]) or (
        "opportunistic" if is_spot(labels, view.lifecycle) else "baseline")
    if tier not in ("baseline", "opportunistic"):
        raise PlatformError(f"tier {tier!r} is neither baseline nor opportunistic")
    return Identity(region=region, service=wanted.service, model=wanted.model,
                    accelerator=accelerator, tier=tier)


def share(wanted: Wanted, view: View) -> Share:
    """The replica's pool and units. Units are measured, capped by the configured ones; the
    configured accelerator units stand in where no GPU is visible."""
    identity = identify(wanted, view)
    sources: dict[str, str] = {}
    if view.quota is not None:
        cpu, sources["cpu"] = view.quota.cores, f"{view.quota_source} {view.quota.cpu_max()}"
    else:
        cpu, sources["cpu"] = float(view.cpus), f"{view.cpus} CPUs (no quota)"
    if wanted.cpu_units is not None and wanted.cpu_units < cpu:
        cpu, sources["cpu"] = wanted.cpu_units, f"capped by --cpu-units ({sources['cpu']})"
    if identity.accelerator == "cpu":
        accel = 1.0 if wanted.accelerator_units is None else wanted.accelerator_units
        sources["accelerator"] = "a CPU replica" if wanted.accelerator_units is None \
            else "--accelerator-units"
    elif view.gpus:
        accel, sources["accelerator"] = float(view.gpus), f"{view.gpus} GPU(s) visible"
        if wanted.accelerator_units is not None and wanted.accelerator_units < accel:
            accel = wanted.accelerator_units
            sources["accelerator"] = f"capped by --accelerator-units ({view.gpus} visible)"
    elif wanted.accelerator_units is not None:
        accel = wanted.accelerator_units
        sources["accelerator"] = "--accelerator-units (no GPU visible here)"
    elif not identity.lends:  # a baseline replica's notices take nothing off any grant
        accel, sources["accelerator"] = 0.0, "none visible (a baseline replica lends none)"
    else:
        raise PlatformError(f"no {identity.accelerator} visible here (no /dev/nvidia<N>): give "
                            "--accelerator-units, the worker's GPU count (a sidecar does not "
                            "see the worker's GPUs)")
    return Share(identity=identity, accelerator_units=round(accel, 6),
                 cpu_units=round(cpu, 6), sources=sources)


def accelerator_of(labels: Mapping[str, str], instance_type: str | None) -> str | None:
    """The accelerator type the labels or the instance type name (None: none named)."""
    labels = {k.lower(): v for k, v in labels.items()}
    for key in GPU_LABELS:
        model = gpu_model(labels.get(key, ""))
        if model is not None:
            return model
    kind = instance_type or next((labels[k] for k in INSTANCE_TYPE_LABELS if labels.get(k)),
                                 None)
    return family_accelerator(kind) if kind else None


def gpu_model(product: str) -> str | None:
    """``NVIDIA-A100-SXM4-80GB``, ``nvidia-tesla-a100``, ``nvidia-l4``, ``a10g`` -> the
    model's short name (None: no known model in it)."""
    words = re.split(r"[^a-z0-9]+", product.lower())
    for model in GPU_MODELS:
        if model in words:
            return model
    return None


def family_accelerator(instance_type: str) -> str | None:
    """``g5.xlarge`` -> ``a10g``, ``a2-highgpu-1g`` -> ``a100``; None for other families."""
    family = re.split(r"[.-]", instance_type.strip().lower(), maxsplit=1)[0]
    return FAMILY_ACCELERATORS.get(family)


def is_spot(labels: Mapping[str, str], lifecycle: str | None) -> bool:
    """A spot or preemptible machine, by the metadata's lifecycle or a provider's label."""
    if (lifecycle or "").strip().lower() == "spot":
        return True
    labels = {k.lower(): v for k, v in labels.items()}
    return any(labels.get(key, "").strip().lower() == value for key, value in SPOT_LABELS)


def parse_labels(text: str) -> dict[str, str]:
    """A Kubernetes downward-API labels or annotations file: one ``key="value"`` a line, the
    value quoted as Go's ``%q`` quotes it. Raises ValueError naming the line it cannot read."""
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"line {n}: {line[:80]!r} is not key=\"value\"")
        value = value.strip()
        if value.startswith('"'):
            try:
                parsed = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                raise ValueError(f"line {n}: {value[:80]} is not a quoted string") from None
            if not isinstance(parsed, str):
                raise ValueError(f"line {n}: {value[:80]} is not a quoted string")
            value = parsed
        out[key.strip()] = value
    return out


def kubelet_quota(millicores: str) -> Quota:
    """A container's CPU limit as the Kubernetes downward API writes it (``resourceFieldRef``
    ``limits.cpu`` with divisor ``1m``: ``"500"``), as the quota the kubelet sets from it: a
    sidecar cannot read the worker container's cgroup, but can be handed its limit this way."""
    try:
        value = int(millicores.strip())
    except ValueError:
        raise ValueError(f"{millicores.strip()[:40]!r} is not a CPU limit in millicores (the "
                         "downward API's limits.cpu with divisor 1m)") from None
    if value <= 0:
        raise ValueError(f"CPU limit {value}m is not positive")
    return Quota(value * 100, 100_000)


def count_gpus(device_names: list[str], env: Mapping[str, str]) -> int:
    """GPUs this process may use: the ``nvidia<N>`` device nodes in ``/dev``, as narrowed by
    ``NVIDIA_VISIBLE_DEVICES`` (the container runtime's list: ``all``, ``none``/``void``, or
    indexes/UUIDs) and then ``CUDA_VISIBLE_DEVICES`` (what CUDA shows the process: empty or
    ``-1`` hides every GPU)."""
    count = sum(1 for name in device_names if re.fullmatch(r"nvidia\d+", name))
    nvidia = env.get("NVIDIA_VISIBLE_DEVICES")
    if nvidia is not None:
        listed = nvidia.strip().lower()
        if listed in ("", "none", "void"):
            return 0
        if listed != "all":
            named = len([d for d in listed.split(",") if d.strip()])
            count = min(count, named) if count else named
    cuda = env.get("CUDA_VISIBLE_DEVICES")
    if cuda is not None:
        shown = [d.strip() for d in cuda.split(",")]
        usable = 0
        for d in shown:  # CUDA stops at the first entry it cannot use
            if not d or d.startswith("-"):
                break
            usable += 1
        count = min(count, usable)
    return count
