"""A model server as the worker's scorer, over the Open Inference Protocol (KServe v2 REST).

A team that already runs Triton, KServe, MLServer or TorchServe keeps it: the Surplus worker
stands in front, keeps admission, batching, shedding on notices, telemetry and the measured
cost, and sends each batch to ``POST /v2/models/{name}/infer`` (``[model] backend = "oip"``).
The server only scores. The measured cost stays right: the batcher times each call, so the
busy seconds per unit are what a unit takes on that server, round trip included.

:class:`OipModel` is a :class:`workers.runtime.batching.Scorer`: ``score`` is called from the
inference thread, one batch at a time, and blocks on the HTTP call with the GIL released, so
the event loop and the notice path run meanwhile. urllib3's connection pool keeps the
connections alive between batches (a new TCP connection per batch would add a round trip
and a TIME_WAIT socket to each). :func:`connect` is what start does: wait until the server
and the model say ready, check the model's metadata against the tensors the worker will
send, and warm up with probe batches; any failure stops the worker with one line naming the
config key or the metadata field. The wire format lives in ``workers.runtime.oip_wire``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import quote

import numpy as np
import urllib3
from urllib3.util import Retry, Timeout, parse_url

from workers.features import Signature, SpecError, assemble, example_rows
from workers.runtime.models import ModelLoadError, ModelSpec, warmup_sizes
from workers.runtime.oip_wire import (
    ModelMetadata,
    OipError,
    OipSpec,
    check_metadata,
    decode_metadata,
    decode_scores,
    encode_infer,
    signature_inputs,
)

_JSON = {"Content-Type": "application/json"}
#: Between readiness polls at start.
_POLL_S = 0.2


class OipCallError(RuntimeError):
    """A call to the model server failed (transport, status, or an answer not understood)."""


class OipModel:
    """One model on one server; see the module docstring. Not for concurrent ``score`` calls
    (the batcher makes none); start-up calls come before the inference thread starts."""

    def __init__(self, spec: OipSpec, signature: Signature) -> None:
        self.spec = spec
        self.signature = signature
        base = spec.url.rstrip("/")
        prefix = (parse_url(base).path or "").rstrip("/")
        model = f"{prefix}/v2/models/{quote(spec.model_name, safe='')}"
        if spec.model_version is not None:
            model += f"/versions/{quote(spec.model_version, safe='')}"
        self._paths = {"server_ready": f"{prefix}/v2/health/ready",
                       "model_ready": f"{model}/ready", "metadata": model,
                       "infer": f"{model}/infer"}
        self.source = f"oip:{base}/v2/models/{spec.model_name}"
        # One retry on a failed connect only: a refused or reset connect sent nothing, while
        # a read error may come after the server did the work (and a retry doubles the wait).
        self._pool = urllib3.connection_from_url(
            base, maxsize=spec.connections, block=False,
            timeout=Timeout(connect=spec.connect_timeout_s, read=spec.timeout_s),
            retries=Retry(total=1, connect=1, read=0, status=0, other=0, redirect=0))
        # The fixed signature's tensors keep their configurable names; declared inputs are
        # sent under their own.
        renames = ({} if signature.declared else
                   {"dense": spec.dense_input, "sparse": spec.sparse_input})
        self._args = signature.args()
        self._inputs = signature_inputs(self._args, renames)

    def score(self, *inputs: np.ndarray) -> np.ndarray:
        """Scores (float32[B]) of one batch, from the server; raises :class:`OipCallError`.
        ``inputs`` are the spec's tensors in order (`workers.features.assemble`)."""
        body = encode_infer([(want.name, np.ascontiguousarray(x, arg.dtype))
                             for x, want, arg in zip(inputs, self._inputs, self._args,
                                                     strict=True)], self.spec.output)
        answer = self._call("POST", "infer", body)
        # The batch's rows: any [B, d] tensor's first dimension, else a multi-hot offsets' less 1.
        rows = next((len(x) for x, arg in zip(inputs, self._args, strict=True)
                     if len(arg.shape) == 2), len(inputs[-1]) - 1)
        try:
            return decode_scores(answer, self.spec.output, rows)
        except OipError as exc:
            raise OipCallError(f"{self.source}: {exc}") from None

    def ready(self) -> str | None:
        """None once the server and the model say ready; else what is not, for the log."""
        for what in ("server_ready", "model_ready"):
            try:
                self._call("GET", what)
            except OipCallError as exc:
                return str(exc)
        return None

    def metadata(self) -> ModelMetadata:
        try:
            return decode_metadata(self._call("GET", "metadata"))
        except OipError as exc:
            raise OipCallError(f"{self.source}: {exc}") from None

    def check(self) -> None:
        """Raise :class:`OipError` naming the field where the model's metadata does not
        declare the tensors the worker sends."""
        check_metadata(self.metadata(), self._inputs, self.spec.output)

    def close(self) -> None:
        self._pool.close()

    def _call(self, method: str, what: str, body: bytes | None = None) -> bytes:
        path = self._paths[what]
        try:
            response = self._pool.urlopen(method, path, body=body,
                                          headers=_JSON if body is not None else None)
        except urllib3.exceptions.HTTPError as exc:
            raise OipCallError(f"{method} {self.spec.url.rstrip('/')}{path}: {exc}") from None
        if response.status != 200:
            text = response.data[:300].decode("utf-8", "replace").strip()
            raise OipCallError(f"{method} {self.spec.url.rstrip('/')}{path}: HTTP "
                               f"{response.status}: {text}")
        return bytes(response.data)


def connect(spec: ModelSpec, sleep: Callable[[float], None] = time.sleep,
            clock: Callable[[], float] = time.monotonic) -> OipModel:
    """The model server of ``spec.oip``, ready, checked and warmed up; else
    :class:`ModelLoadError` with one line naming the config key or metadata field.

    Called at start, before the worker takes traffic (``Worker.start``)."""
    if spec.oip is None:
        raise ModelLoadError("bad worker config at `model.oip`: backend \"oip\" needs it")
    try:
        signature = spec.signature()
    except SpecError as exc:
        raise ModelLoadError(f"bad worker config at {exc}") from None
    model = OipModel(spec.oip, signature)
    try:
        _wait_ready(model, spec.oip, sleep, clock)
        if spec.oip.check_metadata:
            try:
                model.check()
            except OipError as exc:
                raise ModelLoadError(f"{model.source} does not take what the worker sends: "
                                     f"{exc}") from None
        _warm_up(model, spec)
    except (ModelLoadError, OipCallError) as exc:
        model.close()
        if isinstance(exc, ModelLoadError):
            raise
        raise ModelLoadError(str(exc)) from None
    return model


def _wait_ready(model: OipModel, oip: OipSpec, sleep: Callable[[float], None],
                clock: Callable[[], float]) -> None:
    deadline = clock() + oip.ready_timeout_s
    while (why := model.ready()) is not None:
        if clock() >= deadline:
            raise ModelLoadError(f"model server at `model.oip.url` {oip.url} not ready after "
                                 f"`model.oip.ready_timeout_s` = {oip.ready_timeout_s:g} s: "
                                 f"{why}")
        sleep(_POLL_S)


def _warm_up(model: OipModel, spec: ModelSpec) -> None:
    """Probe batches of 2, 4, ... ``warmup_rows`` rows: the answer's shape is checked once
    here rather than on live traffic, and the server's first passes of each size (and the
    pooled connection) are not spent on live requests."""
    for rows in warmup_sizes(spec.warmup_rows):
        try:
            model.score(*assemble([example_rows(model.signature, rows, seed=rows)]))
        except OipCallError as exc:
            raise ModelLoadError(f"{model.source} failed a probe batch of {rows} rows: "
                                 f"{exc}") from None
