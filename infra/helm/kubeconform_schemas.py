"""Lay out the JSON schemas kubeconform checks the chart against, with no network at check time.

- Kubernetes' own kinds: the schemas kubernetes-validate ships (a PyPI wheel, read as a zip),
  one Kubernetes version each, made self-resolving: their ``$id`` points at kubernetes.io and
  their ``$ref`` at ``/api/_definitions.json``, which kubeconform would fetch; relative to the
  file, they resolve beside it.
- prometheus-operator's kinds (ServiceMonitor, PrometheusRule): from the CRDs controller-gen
  generates from the operator's Go types, turned into strict schemas the way kubeconform's own
  openapi2jsonschema does (an object with properties admits no other property).

Usage: kubeconform_schemas.py --wheel WHEEL --versions 1.29.0 1.37.0 --crds DIR --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

import yaml

PREFIX = "kubernetes_validate/kubernetes-json-schema/"


def kubernetes_schemas(wheel: Path, version: str, out: Path) -> int:
    """Write the strict schemas of Kubernetes `version` under out/v<version>-local-strict."""
    folder = f"{PREFIX}v{version}-local-strict/"
    target = out / f"v{version}-local-strict"
    target.mkdir(parents=True, exist_ok=True)
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if not (name.startswith(folder) and name.endswith(".json")):
                continue
            schema = json.loads(archive.read(name))
            schema.pop("$id", None)
            text = json.dumps(schema).replace('"/api/_definitions.json#', '"_definitions.json#')
            (target / name.removeprefix(folder)).write_text(text)
            count += 1
    if not count:
        raise SystemExit(f"{wheel} has no schemas for Kubernetes v{version}")
    return count


def strict(node: Any) -> Any:
    """kubectl's rule: an object schema that lists properties allows no others, unless it says
    otherwise; int-or-string fields accept either."""
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node \
                and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
        if node.pop("x-kubernetes-int-or-string", False):
            node.pop("type", None)
            node["oneOf"] = [{"type": "string"}, {"type": "integer"}]
        for value in node.values():
            strict(value)
    elif isinstance(node, list):
        for value in node:
            strict(value)
    return node


def crd_schemas(crds: Path, out: Path) -> int:
    """Write out/crds/<group>/<kind>_<version>.json for every served version of every CRD."""
    count = 0
    for path in sorted(crds.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"].lower()
        for version in crd["spec"]["versions"]:
            schema = strict(version["schema"]["openAPIV3Schema"])
            target = out / "crds" / group / f"{kind}_{version['name']}.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(schema))
            count += 1
    if not count:
        raise SystemExit(f"no CRDs in {crds}")
    return count


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--versions", nargs="+", required=True)
    parser.add_argument("--crds", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    for version in args.versions:
        n = kubernetes_schemas(args.wheel, version, args.out)
        print(f"Kubernetes v{version}: {n} schemas")
    print(f"CRDs: {crd_schemas(args.crds, args.out)} schemas")


if __name__ == "__main__":
    main(sys.argv[1:])
