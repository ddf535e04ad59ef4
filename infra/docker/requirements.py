"""Print the requirements of the named extras of pyproject.toml (and the base dependencies),
one a line, leaving out the names after --without; `surplus[...]` self-references are followed.

    python3 requirements.py pyproject.toml client control report worker --without torch

The image installs the third-party packages in a layer of their own, before the source is copied,
so a change to the code does not reinstall them; requirements.lock pins each (`pip -c`).
"""

from __future__ import annotations

import re
import sys
import tomllib


def requirements(pyproject: dict, extras: list[str], without: set[str]) -> list[str]:
    project = pyproject["project"]
    optional = project.get("optional-dependencies", {})
    found: list[str] = []
    seen: set[str] = set()

    def add(reqs: list[str]) -> None:
        for req in reqs:
            name = re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower()
            if name == project["name"]:
                inner = re.search(r"\[(.*?)\]", req)
                for extra in (inner.group(1).split(",") if inner else []):
                    if extra.strip() not in seen:
                        seen.add(extra.strip())
                        add(optional[extra.strip()])
            elif name not in without and req not in found:
                found.append(req)

    add(project.get("dependencies", []))
    for extra in extras:
        seen.add(extra)
        add(optional[extra])
    return found


def main(argv: list[str]) -> None:
    without: set[str] = set()
    if "--without" in argv:
        i = argv.index("--without")
        without = {name.lower() for name in argv[i + 1:]}
        argv = argv[:i]
    with open(argv[0], "rb") as f:
        pyproject = tomllib.load(f)
    print("\n".join(requirements(pyproject, argv[1:], without)))


if __name__ == "__main__":
    main(sys.argv[1:])
