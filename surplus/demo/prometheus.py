"""Prometheus for a demo run (``--prometheus``): every process's /metrics scraped, the
workers labelled with their pool as compose's scrape config and the chart's ServiceMonitor
do, so the dashboard reads the same series here as on a fleet.

Optional: without a ``prometheus`` binary the run goes on and says how to get one.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from surplus import localkafka
from surplus.demo.children import Children
from surplus.demo.options import Ports
from surplus.demo.runinfo import prometheus_config
from surplus.live import plan


def start(children: Children, ports: Ports, replicas: list[plan.Replica], *, out: Path,
          state: Path, say: Callable[[str], None]) -> int:
    """Start Prometheus as the run's child ``prometheus``; its port, 0 when there is none.

    :param children: the run's processes; Prometheus joins them, to be stopped with them.
    :param ports: the metrics port of every process of the run.
    :param replicas: the run's replicas, for each worker target's pool label.
    :param out: the run's output folder, where the scrape config is written.
    :param state: the run's temporary folder, where Prometheus keeps its samples.
    :param say: where the address (or the missing binary) is printed.
    """
    binary = shutil.which("prometheus")
    if binary is None:
        say("prometheus: no `prometheus` binary on PATH (Debian/Ubuntu: apt install "
            "prometheus); going on without it")
        return 0
    targets = {"control-plane": [ports.control], "scheduler": [ports.scheduler],
               "loadgen": [ports.loadgen], "workers": sorted(ports.workers.values())}
    pools = {ports.workers[r.worker_id]: r.pool_id for r in replicas}
    config = out / "prometheus.yml"
    config.write_text(prometheus_config(targets, pools))
    port = localkafka.free_port()
    children.launch("prometheus", [f"--config.file={config}",
                                   f"--storage.tsdb.path={state / 'prometheus'}",
                                   f"--web.listen-address=127.0.0.1:{port}"], program=[binary])
    say(f"prometheus: http://127.0.0.1:{port} (scraping {sum(map(len, targets.values()))}"
        " endpoints every 2s)")
    return port
