"""`surplus[client]` installs what a ranking service embeds and nothing heavy: a fresh venv
with only that extra (from a wheel of this tree, pinned by requirements.lock) imports and uses
the client. A dependency the client imports but the extra lacks fails here, as it would for the
first service to install it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "schemas", "streams", "workers", "sim", "surplus",
           "bench")


def _run(*argv: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _wheel(tmp_path: Path) -> Path:
    """A wheel built from a copy of the tree (the shared checkout gets no build/ of ours)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(path, src / name)
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", tmp_path / "dist", src)
    (wheel,) = (tmp_path / "dist").glob("surplus-*.whl")
    return wheel


@pytest.mark.slow
def test_client_extra_alone_imports_and_ranks_without_torch_faust_highs_matplotlib(
        tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    _run(venv / "bin" / "pip", "install", "-q", "-c", ROOT / "requirements.lock",
         f"{wheel}[client]")
    out = _run(venv / "bin" / "python", ROOT / "tests" / "packaging" / "client_only.py",
               cwd=tmp_path)
    assert "ranked one request" in out
    size_mb = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file()) / 2**20
    print(f"\nclient-only venv: {size_mb:.0f} MiB")
    assert size_mb < 300, f"client-only venv is {size_mb:.0f} MiB: something heavy came along"
