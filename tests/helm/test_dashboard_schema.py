"""The dashboard against Grafana's own definition of it: @grafana/schema (npm), the TypeScript types
Grafana generates from its CUE kinds (the dashboard, each panel plugin's options and field
config), checked by the TypeScript compiler. The dashboard, and each panel's options and custom
field config, become object literals that must satisfy those types: an unknown key, a value of
the wrong type or an enum value Grafana does not know fails the check.

Both packages are pinned in infra/grafana/schema/package-lock.json; `make helm-check` installs
them (npm ci) before it runs tests/helm.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helm.test_chart import CHART, ROOT

pytestmark = pytest.mark.helm

DASHBOARD = CHART / "dashboards" / "surplus.json"
MODULES = ROOT / "infra" / "grafana" / "schema" / "node_modules"
TYPES = MODULES / "@grafana" / "schema" / "dist" / "types"
TSC = MODULES / "typescript" / "bin" / "tsc"
# Panel plugin -> its generated types (module, options type, custom field config type or None).
PANELS = {
    "timeseries": ("raw/composable/timeseries/panelcfg/x/types.gen", "Options", "FieldConfig"),
    "stat": ("raw/composable/stat/panelcfg/x/types.gen", "Options", None),
}


def _typescript(board: dict[str, Any]) -> str:
    lines = ['import type { Dashboard } from "@grafana/schema";',
             # JSON holds an enum's value, not the TypeScript enum: each string enum as the
             # union of its values, the rest of the type as it is.
             "type Json<T> = T extends string ? `${T}` : T extends (infer U)[] ? Json<U>[]",
             "  : T extends object ? { [K in keyof T]: Json<T[K]> } : T;",
             # A plugin's options and field config: Grafana fills in the defaults of those
             # left out when it loads the panel, so each may be left out (but not mistyped).
             "type Saved<T> = T extends string ? `${T}` : T extends (infer U)[] ? Saved<U>[]",
             "  : T extends object ? { [K in keyof T]?: Saved<T[K]> } : T;"]
    for plugin, (module, _, _) in PANELS.items():
        lines.append(f'import type * as {plugin} from "@grafana/schema/{module}";')
    lines.append(f"export const dashboard = ({json.dumps(board)}) satisfies Json<Dashboard>;")
    for i, panel in enumerate(board.get("panels", [])):
        if panel.get("type") == "row":
            continue
        if panel.get("type") not in PANELS:
            # not a plugin whose types are checked here: the compiler is made to say so
            lines.append(f"export const panel{i}_type: never = {json.dumps(panel.get('type'))};")
            continue
        _, options, custom = PANELS[panel["type"]]
        lines.append(f"export const panel{i}_options = ({json.dumps(panel.get('options', {}))})"
                     f" satisfies Saved<{panel['type']}.{options}>;")
        field = panel.get("fieldConfig", {}).get("defaults", {}).get("custom")
        if custom and field is not None:
            lines.append(f"export const panel{i}_custom = ({json.dumps(field)})"
                         f" satisfies Saved<{panel['type']}.{custom}>;")
    return "\n".join(lines) + "\n"


def _check(board: dict[str, Any], tmp: Path) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    if node is None or not TSC.exists():
        pytest.fail("node or infra/grafana/schema/node_modules missing: `make helm-check` runs "
                    "npm ci there (Node.js 18+)")
    (tmp / "dashboard.ts").write_text(_typescript(board))
    paths = {"@grafana/schema": [str(TYPES / "index.d.ts")]}
    paths |= {f"@grafana/schema/{module}": [str(TYPES / f"{module}.d.ts")]
              for module, _, _ in PANELS.values()}
    (tmp / "tsconfig.json").write_text(json.dumps({
        "compilerOptions": {"strict": True, "noEmit": True, "target": "es2022",
                            "module": "es2022", "moduleResolution": "bundler",
                            "skipLibCheck": True, "paths": paths, "types": []},
        "files": ["dashboard.ts"]}))
    return subprocess.run([node, str(TSC), "-p", str(tmp / "tsconfig.json"), "--pretty", "false"],
                          capture_output=True, text=True, timeout=180, cwd=tmp)


def test_the_dashboard_satisfies_grafanas_dashboard_and_panel_types(tmp_path: Path) -> None:
    done = _check(json.loads(DASHBOARD.read_text()), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def _broken(edit: Any) -> dict[str, Any]:
    board = copy.deepcopy(json.loads(DASHBOARD.read_text()))
    edit(board["panels"][0])
    return board


@pytest.mark.parametrize("name, edit, error", [
    ("gridPos width as a string", lambda p: p["gridPos"].update(w="12"), "TS2322"),
    ("an unknown panel key", lambda p: p.update(gridpos=p["gridPos"]), "TS2353"),
    ("a legend mode Grafana has not", lambda p: p["options"]["legend"].update(
        displayMode="sideways"), "TS2322"),
    ("a draw style Grafana has not", lambda p: p["fieldConfig"]["defaults"]["custom"].update(
        drawStyle="zigzag"), "TS2322"),
    ("a panel plugin with no types here", lambda p: p.update(type="timeseriez"), "TS2322"),
])
def test_a_broken_panel_fails_the_check(name: str, edit: Any, error: str, tmp_path: Path) -> None:
    done = _check(_broken(edit), tmp_path)
    assert done.returncode != 0, f"{name}: passed"
    errors = [line for line in done.stdout.splitlines() if "error TS" in line]
    assert len(errors) == 1 and error in errors[0], done.stdout
