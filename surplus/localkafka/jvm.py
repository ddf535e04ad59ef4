"""A broker JVM and its files: where the jars, configs and data live, fetching the jars
with Maven, formatting KRaft storage, starting a JVM in a session of its own, reading its pid
file and its logs (the cause of a failed start, its GC pauses), and stopping it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


INFRA_DIR = REPO_ROOT / "infra" / "kafka"


DEFAULT_LIBS = REPO_ROOT / ".kafka" / "libs"


DEFAULT_DATA = REPO_ROOT / ".kafka" / "data"


DEFAULT_PORT = 9092


BROKER_GC = ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20")
"""The collector Kafka's own start script uses. Every produce and fetch, preemption notices'
included, waits out a stop-the-world pause: in six 40 s demos each here, the longest pause
was 18-28 ms with these and 35-102 ms with the serial collector used before."""


GC_LOG = "gc.log"
"""The broker JVM's collector log in its data directory (``-Xlog:gc``, wall-clock stamps)."""


_GC_PAUSE = re.compile(r"^\[(?P<at>\d+)ms\] GC\(\d+\) Pause .* (?P<ms>\d+(?:\.\d+)?)ms$",
                       re.MULTILINE)


START_TIMEOUT_S = 90.0


STOP_TIMEOUT_S = 30.0


class BrokerError(RuntimeError):
    """A broker could not be fetched, started, queried or stopped; the message says why."""


def kafka_version() -> str:
    """The Kafka release every Surplus broker runs: the pom's ``kafka.version`` (the embedded
    broker's jars). docker-compose.yml and the test containers' image use the same tag, and a
    test holds them to it, so no path tests against one Kafka and deploys another."""
    import xml.etree.ElementTree as ET

    pom = INFRA_DIR / "pom.xml"
    node = ET.parse(pom).getroot().find(
        "m:properties/m:kafka.version", {"m": "http://maven.apache.org/POM/4.0.0"})
    if node is None or not (node.text or "").strip():
        raise BrokerError(f"{pom} sets no kafka.version")
    return (node.text or "").strip()


def libs_dir() -> Path:
    return Path(os.environ.get("SURPLUS_KAFKA_LIBS", DEFAULT_LIBS))


def java_binary() -> str:
    """The Java launcher: $JAVA_HOME/bin/java if set, else `java` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise BrokerError("java not found: install Java 17+ or set JAVA_HOME")
    return found


def fetch_jars(quiet: bool = True) -> Path:
    """Resolve the Kafka broker jars from Maven Central into `.kafka/libs` (no-op if present)."""
    target = libs_dir()
    if has_kafka_jars(target):
        return target
    mvn = shutil.which("mvn")
    if not mvn:
        raise BrokerError("mvn not found: install Maven, or put the Kafka jars in " + str(target))
    cmd = [mvn, "-B", "-f", str(INFRA_DIR / "pom.xml"), "dependency:copy-dependencies",
           f"-Dlibs.dir={target}"]
    if quiet:
        cmd.insert(1, "-q")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not has_kafka_jars(target):
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        raise BrokerError(f"could not fetch Kafka jars with Maven: {tail[0]}")
    return target


def has_kafka_jars(path: Path) -> bool:
    return path.is_dir() and any(path.glob("kafka_2.13-*.jar"))


def classpath() -> str:
    libs = libs_dir()
    if not has_kafka_jars(libs):
        raise BrokerError(f"Kafka jars missing in {libs}: run `surplus kafka fetch`")
    return str(libs / "*")


def log_flags() -> list[str]:
    return [f"-Dlog4j2.configurationFile={INFRA_DIR / 'log4j2.properties'}"]


def new_cluster_id() -> str:
    return uuid.uuid4().hex[:22]


def format_command(java: str, config: Path, cluster_id: str,
                    extra_args: list[str] | None = None) -> list[str]:
    return [java, "-cp", classpath(), *log_flags(), "kafka.tools.StorageTool", "format",
            "-t", cluster_id, "-c", str(config), "--ignore-formatted", *(extra_args or [])]


def start_jvm(java: str, config: Path, data_dir: Path, port: int,
               heap_mb: int) -> subprocess.Popen[bytes]:
    """One broker JVM in a session of its own, its pid and port recorded in ``data_dir``."""
    log = (data_dir / "broker.log").open("ab")
    proc = subprocess.Popen(
        [java, f"-Xms{heap_mb // 2}m", f"-Xmx{heap_mb}m", *BROKER_GC,
         f"-Xlog:gc:file={data_dir / GC_LOG}:timemillis",
         "-Djava.awt.headless=true", *log_flags(), "-cp", classpath(), "kafka.Kafka",
         str(config)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    (data_dir / "broker.pid").write_text(f"{proc.pid} {port}\n")
    return proc


def gc_pauses(text: str) -> list[tuple[int, float]]:
    """The stop-the-world pauses in a broker's ``GC_LOG``: (wall-clock ms, pause ms) each.

    A pause stops every produce and fetch on the broker, a preemption notice's included: with
    the log, a run can tell a notice delayed by the broker from one delayed elsewhere."""
    return [(int(m["at"]), float(m["ms"])) for m in _GC_PAUSE.finditer(text)]


def log_cause(data_dir: Path) -> str:
    try:
        lines = (data_dir / "broker.log").read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no broker log"
    errors = [ln for ln in lines if " ERROR " in ln or "Exception" in ln]
    if errors:
        # The first error is the cause; what follows is often the shutdown it set off.
        return errors[0][:300] + (f" (then: {errors[-1][:200]})" if len(errors) > 1 else "")
    return (lines or ["empty broker log"])[-1][:300]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); treat it as dead.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def read_state(data_dir: Path) -> tuple[int, int] | None:
    state = data_dir / "broker.pid"
    if not state.exists():
        return None
    try:
        pid_s, port_s = state.read_text().split()
        return int(pid_s), int(port_s)
    except ValueError:
        return None


def node_dirs(data_dir: Path) -> list[Path]:
    if not data_dir.is_dir():
        return []
    return sorted((p for p in data_dir.glob("node-*") if p.is_dir() and p.name[5:].isdigit()),
                  key=lambda p: int(p.name[5:]))


def terminate(*pids: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM to each process group at once (the nodes of a cluster shut down together, so
    none waits on a quorum already gone), SIGKILL to those still there after ``timeout_s``."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        for pid in alive:
            _reap(pid)
        alive = [pid for pid in alive if pid_alive(pid)]
        if alive:
            time.sleep(0.1)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        _reap(pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def rss_mb(pid: int) -> float:
    """Resident memory of a process in MiB (for the broker footprint in notes and status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
