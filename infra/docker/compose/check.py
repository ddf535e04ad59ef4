"""What `make compose-up-test` asserts of the stack docker-compose.local.yml brought up.

1. Targets flow: the control plane's ControlTargets are on the targets topic (read here from
   the broker) and every worker holds targets from it (`surplus_worker_targets_epoch` >= 0,
   younger than the 30 s TTL, as Prometheus scraped them).
2. Lent capacity, with no scheduler: the capacity agents' grants of both opportunistic workers
   are on the control plane's books (`surplus_control_opportunistic_units`: half a CPU unit
   each, their `cpus` slices, and one `cpu` accelerator unit each).
3. Prometheus has every target of infra/docker/compose/prometheus.yml up.
4. Grafana (only with --grafana URL, where the `grafana` profile runs): the provisioned
   dashboard "Surplus" loads over HTTP with its panels, and the home page is served.

Each check polls until it holds or its deadline passes; exit 1 names what did not hold.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

EXPECTED_JOBS = {"control-plane": 1, "workers": 3, "loadgen": 1}


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)


def poll(what: str, deadline_s: float, check: Callable[[], str | None]) -> bool:
    """Calls `check` until it returns None (holds) or the deadline; prints the outcome."""
    start = time.monotonic()
    last = "not tried"
    while time.monotonic() - start < deadline_s:
        try:
            problem = check()
        except Exception as exc:  # a service still starting: connection refused, 404, ...
            problem = f"{type(exc).__name__}: {exc}"
        if problem is None:
            print(f"ok   {what} ({time.monotonic() - start:.0f} s)")
            return True
        last = problem
        time.sleep(2)
    print(f"FAIL {what}: {last}")
    return False


def targets_on_topic(bootstrap: str, topic: str) -> str | None:
    from schemas import kafka_clients
    from schemas.codec import decode
    from schemas.contract import ControlTargets
    from schemas.kafka_config import KafkaSettings

    consumer = kafka_clients.consumer(KafkaSettings(bootstrap=bootstrap), "compose-up-test",
                                      **{"enable.auto.commit": False})
    try:
        parts = kafka_clients.partitions(consumer, topic, timeout_s=5)
        consumer.assign(kafka_clients.starting_at(topic, parts, 0))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            value = msg.value() if msg is not None and msg.error() is None else None
            if msg is not None and value:
                targets = decode(ControlTargets, value)
                print(f"     {topic}: {msg.key()!r} epoch {targets.epoch}")
                return None
        return f"no ControlTargets on {topic}"
    finally:
        consumer.close()


def query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    return list(get_json(url)["data"]["result"])


def workers_hold_targets(prometheus: str) -> str | None:
    epochs = query(prometheus, "surplus_worker_targets_epoch")
    ages = {r["metric"]["instance"]: float(r["value"][1])
            for r in query(prometheus, "surplus_worker_targets_age_seconds")}
    held = {r["metric"]["instance"]: float(r["value"][1]) for r in epochs}
    if len(held) < EXPECTED_JOBS["workers"]:
        return f"{len(held)} workers scraped"
    missing = [i for i, epoch in held.items() if epoch < 0 or not 0 <= ages.get(i, -1) < 30]
    if missing:
        return f"no fresh targets on {missing} (epochs {held}, ages {ages})"
    delivered = query(prometheus, "sum(surplus_control_targets_total)")
    if not delivered or float(delivered[0]["value"][1]) <= 0:
        return "the control plane has published no targets"
    print(f"     workers' target epochs {sorted(held.values())}, ages {sorted(ages.values())} s")
    return None


def capacity_on_the_books(prometheus: str) -> str | None:
    """Both agents' shares: 2 x 0.5 CPU units (their slices) and 2 `cpu` accelerator units."""
    units = {r["metric"]["resource"]: float(r["value"][1])
             for r in query(prometheus, 'surplus_control_opportunistic_units{scope="eu1"}')}
    if units.get("cpu_units") != 1.0 or units.get("cpu") != 2.0:
        return f"not both agents' shares on the control plane's books: {units}"
    print(f"     lent capacity on the books: {units}")
    return None


def optional_work_done(prometheus: str) -> str | None:
    """What the lent replicas are for: requests served by the powerful model (it runs only on
    the agents' opportunistic replica) and extra candidates scored, as the load generator
    counted them."""
    def total(promql: str) -> float:
        rows = query(prometheus, promql)
        return float(rows[0]["value"][1]) if rows else 0.0

    powerful = total('sum(surplus_loadgen_latency_seconds_count{model="powerful"})')
    extras = total('sum(surplus_loadgen_optional_fate_units_total{fate="done"})')
    if powerful <= 0 or extras <= 0:
        return f"{powerful:.0f} requests served by the powerful model, {extras:.0f} extras done"
    print(f"     {powerful:.0f} requests served by the powerful model, {extras:.0f} extras done")
    return None


def all_targets_up(prometheus: str) -> str | None:
    active = get_json(f"{prometheus}/api/v1/targets")["data"]["activeTargets"]
    jobs: dict[str, int] = {}
    down = []
    for target in active:
        if target["health"] == "up":
            jobs[target["labels"]["job"]] = jobs.get(target["labels"]["job"], 0) + 1
        else:
            down.append(f"{target['scrapeUrl']} {target['health']} {target.get('lastError', '')}")
    if jobs != EXPECTED_JOBS or down:
        return f"up {jobs}, expected {EXPECTED_JOBS}; not up: {down}"
    print(f"     {sum(jobs.values())} targets up: {jobs}")
    return None


def dashboard_loads(grafana: str) -> str | None:
    board = get_json(f"{grafana}/api/dashboards/uid/surplus")["dashboard"]
    panels = board.get("panels", [])
    if board.get("title") != "Surplus" or not panels:
        return f"dashboard {board.get('title')!r} with {len(panels)} panels"
    with urllib.request.urlopen(f"{grafana}/d/surplus", timeout=5) as resp:
        if resp.status != 200:
            return f"/d/surplus answered {resp.status}"
    print(f"     dashboard {board['title']!r}: {len(panels)} panels")
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", default="127.0.0.1:29092")
    parser.add_argument("--topic", default="surplus.targets")
    parser.add_argument("--prometheus", default="http://127.0.0.1:29090")
    parser.add_argument("--grafana", default=None)
    parser.add_argument("--deadline", type=float, default=180)
    args = parser.parse_args()
    ok = poll("targets on the targets topic", args.deadline,
              lambda: targets_on_topic(args.bootstrap, args.topic))
    ok &= poll("every worker holds fresh targets", args.deadline,
               lambda: workers_hold_targets(args.prometheus))
    ok &= poll("the capacity agents' grants are on the control plane's books", args.deadline,
               lambda: capacity_on_the_books(args.prometheus))
    ok &= poll("optional work is done on the lent replicas", args.deadline,
               lambda: optional_work_done(args.prometheus))
    ok &= poll("Prometheus has every target up", args.deadline,
               lambda: all_targets_up(args.prometheus))
    if args.grafana:
        ok &= poll("Grafana serves the Surplus dashboard", args.deadline,
                   lambda: dashboard_loads(args.grafana))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
