"""The demo's scrape config labels each worker with its pool, as compose's and the chart's do."""

from __future__ import annotations

import yaml

from surplus.demo.runinfo import prometheus_config


def test_each_worker_target_carries_its_pool_and_other_jobs_none() -> None:
    pools = {2: "eu1/rank/baseline/cpu/baseline", 3: "eu1/rank/powerful/cpu/opportunistic"}
    config = yaml.safe_load(prometheus_config({"control-plane": [1], "workers": [2, 3]}, pools))
    jobs = {job["job_name"]: job["static_configs"] for job in config["scrape_configs"]}
    assert jobs["control-plane"] == [{"targets": ["127.0.0.1:1"]}]
    assert {c["targets"][0]: c["labels"]["pool"] for c in jobs["workers"]} == {
        "127.0.0.1:2": pools[2], "127.0.0.1:3": pools[3]}


def test_without_pools_every_target_is_plain() -> None:
    config = yaml.safe_load(prometheus_config({"workers": [2, 3]}))
    (workers,) = config["scrape_configs"]
    assert workers["static_configs"] == [{"targets": ["127.0.0.1:2", "127.0.0.1:3"]}]
