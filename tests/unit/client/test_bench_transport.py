"""The transport benchmark times the worker's own decode path in both encodings and reports a
ratio and the bytes of each body (not timed: no assertion on speed)."""

from __future__ import annotations

import json

import pytest

from bench import transport


def test_run_reports_per_candidate_costs_their_ratio_and_body_sizes() -> None:
    result = transport.run(candidates=200, rounds=5)
    decode = result["decode_ns_per_candidate"]
    assert decode["json"] > 0 and decode["msgpack"] > 0
    assert result["json_vs_msgpack_decode"] == pytest.approx(decode["json"] / decode["msgpack"],
                                                             rel=0.02)
    assert result["meets_target"] == (result["json_vs_msgpack_decode"] >= 5.0)
    sizes = result["request_bytes"]
    assert 0 < sizes["msgpack"] < sizes["json"]
    assert result["request_bytes_per_candidate"]["msgpack"] == pytest.approx(
        sizes["msgpack"] / 200, abs=0.1)
    json.dumps(result)


def test_main_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    transport.main(["100"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["bench"] == "transport"
