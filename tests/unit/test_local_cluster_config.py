"""The local cluster's node configs and data-dir guards, without starting a JVM."""

from __future__ import annotations

from pathlib import Path

import pytest

from surplus import localkafka
from surplus.localkafka.broker import write_config
from surplus.localkafka.cluster import cluster_config


def _properties(path: Path) -> dict[str, str]:
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
    return dict(ln.split("=", 1) for ln in lines)


def test_each_node_listens_two_ports_up_and_knows_every_voter(tmp_path: Path) -> None:
    config = _properties(cluster_config(tmp_path, 2, 9092, 3))
    assert config["node.id"] == "2"
    assert config["listeners"] == ("PLAINTEXT://127.0.0.1:9094,"
                                   "CONTROLLER://127.0.0.1:9095")
    assert config["controller.quorum.voters"] == ("1@127.0.0.1:9093,2@127.0.0.1:9095,"
                                                  "3@127.0.0.1:9097")
    assert config["log.dirs"] == str(tmp_path / "logs")


def test_three_nodes_replicate_three_times_and_acknowledge_from_two(tmp_path: Path) -> None:
    config = _properties(cluster_config(tmp_path, 1, 9092, 3))
    for key in ("default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor"):
        assert config[key] == "3", key
    assert config["min.insync.replicas"] == config["transaction.state.log.min.isr"] == "2"


def test_a_cluster_and_a_single_broker_never_share_a_data_dir(tmp_path: Path) -> None:
    (tmp_path / "node-1").mkdir()
    with pytest.raises(localkafka.BrokerError, match="holds a local cluster"):
        localkafka.up(data_dir=tmp_path)
    single = tmp_path / "single"
    (single / "logs").mkdir(parents=True)
    with pytest.raises(localkafka.BrokerError, match="holds a single broker"):
        localkafka.up_cluster(3, data_dir=single)
    with pytest.raises(localkafka.BrokerError, match="a cluster of 1, not of 3 brokers"):
        localkafka.up_cluster(3, data_dir=tmp_path)


def test_a_cluster_of_no_brokers_is_refused_by_name() -> None:
    with pytest.raises(localkafka.BrokerError, match="brokers must be 1 to 9, not 0"):
        localkafka.up_cluster(0)


def test_a_broker_behind_a_proxy_sends_clients_to_the_proxy_and_itself_direct(
        tmp_path: Path) -> None:
    behind = localkafka.BehindProxy(proxy_port=7000, direct_port=7100)
    config = _properties(write_config(tmp_path, 9092, 9093, behind))
    assert config["listeners"] == ("PLAINTEXT://127.0.0.1:9092,DIRECT://127.0.0.1:7100,"
                                   "CONTROLLER://127.0.0.1:9093")
    assert config["advertised.listeners"] == ("PLAINTEXT://127.0.0.1:7000,"
                                              "DIRECT://127.0.0.1:7100")
    assert config["inter.broker.listener.name"] == "DIRECT"


def test_a_local_broker_is_not_both_secured_and_behind_a_proxy(tmp_path: Path) -> None:
    secured = localkafka.SecuredListeners(ssl_port=1, sasl_ssl_port=2, keystore=tmp_path,
                                          truststore=tmp_path)
    with pytest.raises(localkafka.BrokerError, match="either secured or behind a proxy"):
        localkafka.up(data_dir=tmp_path, secured=secured,
                      behind_proxy=localkafka.BehindProxy(proxy_port=3, direct_port=4))
