"""Where a targets signing key is configured: the control plane signs with it, workers check it.

The key may come from a file (kept out of argv and the environment); an unreadable or empty
file, or two keys at once, stops the process at start naming the setting.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas.signing import load_key, sign, verifier
from streams.settings import ControlPlaneSettings
from tests.unit.policy.helpers import targets
from workers.runtime.config import ConfigError, load_config


def test_key_file_is_read_without_surrounding_whitespace(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_bytes(b"  s3cret\n")
    assert load_key(path) == b"s3cret"


@pytest.mark.parametrize("content", [None, b"", b" \n"])
def test_missing_or_empty_key_file_is_refused_naming_the_file(tmp_path: Path,
                                                              content: bytes | None) -> None:
    path = tmp_path / "key"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(str(path))):
        load_key(path)


def test_control_plane_key_from_env_or_file_signs_what_workers_verify(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SURPLUS_CONTROL_SIGNING_KEY", "k-env")
    from_env = ControlPlaneSettings().signing_key_bytes()
    monkeypatch.delenv("SURPLUS_CONTROL_SIGNING_KEY")
    path = tmp_path / "key"
    path.write_text("k-file\n")
    from_file = ControlPlaneSettings(signing_key_file=path).signing_key_bytes()
    assert (from_env, from_file) == (b"k-env", b"k-file")
    assert from_file is not None and verifier("k-file")(sign(targets(), from_file))
    assert ControlPlaneSettings().signing_key_bytes() is None


def test_control_plane_refuses_a_bad_key_file_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as err:
        ControlPlaneSettings(signing_key_file=tmp_path / "absent")
    assert err.value.errors()[0]["loc"] == ("signing_key_file",)
    assert "absent" in str(err.value)


def test_control_plane_refuses_two_keys(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text("k")
    with pytest.raises(ValidationError, match="not both"):
        ControlPlaneSettings(signing_key="k", signing_key_file=path)


def test_worker_key_file_and_its_errors(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text("k-worker\n")
    config = load_config(None, {"worker_id": "w", "targets_signing_key_file": str(path)})
    assert config.signing_key() == b"k-worker"
    assert load_config(None, {"worker_id": "w"}).signing_key() is None
    with pytest.raises(ConfigError, match=r"`targets_signing_key_file`.*absent"):
        load_config(None, {"worker_id": "w", "targets_signing_key_file": str(path) + "absent"})
    with pytest.raises(ConfigError, match="not both"):
        load_config(None, {"worker_id": "w", "targets_signing_key_file": str(path),
                           "targets_signing_key": "k"})
