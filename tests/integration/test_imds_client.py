"""The IMDSv2 client against AWS's metadata mock on 127.0.0.1 (no Kafka): the token flow, "not
now" (404) as no document, a restarted service's 401 answered with a fresh token, and an
unreachable service as one clear error."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from surplus.localkafka import free_port
from tests.integration.metadata_mock import MetadataMock
from workers.capacity.agent import INSTANCE_ACTION, REBALANCE
from workers.capacity.decide import parse_instance_action, parse_rebalance, rfc3339_ms
from workers.capacity.imds import Imds, ImdsError

pytestmark = pytest.mark.slow  # runs a Go program `make ec2-metadata-mock` builds


def _rfc3339(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))


def test_reads_an_interruption_and_a_rebalance_with_an_imdsv2_token(tmp_path: Path) -> None:
    at = _rfc3339(time.time() + 120)
    mock = MetadataMock(tmp_path, ["-a", "stop", "-t", at, "--rebalance-delay-sec", "0"]).start()
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:  # IMDSv1 is refused
            urllib.request.urlopen(f"{mock.url}{INSTANCE_ACTION}", timeout=5)
        assert refused.value.code == 401
        imds = Imds(mock.url)
        body = imds.get(INSTANCE_ACTION)
        assert body is not None
        action = parse_instance_action(body)
        assert (action.action, action.at_ms) == ("stop", rfc3339_ms(at))
        rebalance = imds.get(REBALANCE)
        assert rebalance is not None and parse_rebalance(rebalance).notice_ms > 0
        assert imds.tokens_fetched == 1  # one token serves every read
    finally:
        mock.stop()


def test_not_yet_is_no_document_and_a_restarted_service_gets_a_new_token(
        tmp_path: Path) -> None:
    port = free_port()
    args = ["-a", "terminate", "-d", "600", "--rebalance-delay-sec", "600"]
    mock = MetadataMock(tmp_path, args, port=port, name="aemm-1").start()
    imds = Imds(mock.url)
    try:
        assert imds.get(INSTANCE_ACTION) is None  # no interruption scheduled (404)
        assert imds.get(REBALANCE) is None
    finally:
        mock.stop()
    with pytest.raises(ImdsError, match=f"127.0.0.1:{port} unreachable"):
        imds.get(INSTANCE_ACTION)
    mock = MetadataMock(tmp_path, ["-a", "terminate"], port=port, name="aemm-2").start()
    try:
        body = imds.get(INSTANCE_ACTION)  # the old token is unknown there: 401, then a new one
        assert body is not None and parse_instance_action(body).action == "terminate"
        assert imds.tokens_fetched == 2
    finally:
        mock.stop()
