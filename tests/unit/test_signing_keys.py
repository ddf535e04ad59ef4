"""Where a targets signing key is configured: the control plane signs with it, workers check it.

The key may come from a file (kept out of argv and the environment); an unreadable or empty
file, or two keys at once, stops the process at start naming the setting.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas.signing import load_key, verifier
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
    from_env = ControlPlaneSettings().keys()
    monkeypatch.delenv("SURPLUS_CONTROL_SIGNING_KEY")
    path = tmp_path / "key"
    path.write_text("k-file\n")
    from_file = ControlPlaneSettings(signing_key_file=path).keys()
    assert from_env is not None and from_file is not None
    assert verifier("k-env")(from_env.sign(targets())) is None
    assert verifier("k-file")(from_file.sign(targets())) is None
    assert verifier("k-env")(from_file.sign(targets())) == "bad_signature"
    assert ControlPlaneSettings().keys() is None


def test_control_plane_refuses_a_key_directory_without_its_signing_key_named(
        tmp_path: Path) -> None:
    (tmp_path / "k1").write_text("one")
    (tmp_path / "k2").write_text("two")
    with pytest.raises(ValidationError, match="`active`") as err:
        ControlPlaneSettings(signing_key_file=tmp_path)
    assert err.value.errors()[0]["loc"] == ("signing_key_file",)


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
    keys = config.keys()
    assert keys is not None and verifier("k-worker")(keys.sign(targets())) is None
    assert load_config(None, {"worker_id": "w"}).keys() is None
    with pytest.raises(ConfigError, match=r"`targets_signing_key_file`.*absent"):
        load_config(None, {"worker_id": "w", "targets_signing_key_file": str(path) + "absent"})
    with pytest.raises(ConfigError, match="not both"):
        load_config(None, {"worker_id": "w", "targets_signing_key_file": str(path),
                           "targets_signing_key": "k"})


def test_worker_refuses_a_key_directory_whose_active_key_is_missing(tmp_path: Path) -> None:
    (tmp_path / "k1").write_text("one")
    (tmp_path / "active").write_text("k2")
    with pytest.raises(ConfigError, match=r"`targets_signing_key_file`.*names key 'k2'"):
        load_config(None, {"worker_id": "w", "targets_signing_key_file": str(tmp_path)})
