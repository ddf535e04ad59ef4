"""What a worker serves with: a model in this process (torch, ``LoadedModel``) or a model server
over the Open Inference Protocol (``OipModel``), loaded off the event loop; and a stand-in that
refuses to score until one is, so the batcher exists (and admission with it) from the start."""

from __future__ import annotations

import asyncio
from typing import Protocol

import numpy as np

from workers.runtime.batching import Scorer
from workers.runtime.devices import DeviceMismatch, device_for_pool, stand_in_device
from workers.runtime.models import ModelLoadError, ModelSpec, cuda_device_name, load_model


class ServedModel(Scorer, Protocol):
    """What the worker serves with: ``LoadedModel`` (torch in process) or ``OipModel`` (a
    model server over the Open Inference Protocol); ``source`` says which, in readiness."""

    source: str


class NotLoaded:
    """The batcher's scorer until the model is loaded."""

    def score(self, *inputs: np.ndarray) -> np.ndarray:
        raise RuntimeError("no model loaded")


async def load_served(spec: ModelSpec, accelerator: str = "cpu", *,
                      stand_in: bool = False) -> ServedModel:
    """Load the model on the device its pool's ``accelerator`` lends (``stand_in``: where
    ``model.device`` says, see ``WorkerConfig.accelerator_stand_in``), or connect to the
    model server and check it, off the event loop; ``ModelLoadError`` says why it cannot
    serve. A model server's device is its own: the pool's accelerator names it, unchecked."""
    if spec.backend == "oip":
        from workers.runtime.oip import connect

        return await asyncio.to_thread(connect, spec)
    seen = cuda_device_name()
    try:
        device = (stand_in_device(spec.device, seen) if stand_in
                  else device_for_pool(accelerator, spec.device, seen))
    except DeviceMismatch as exc:
        raise ModelLoadError(f"bad worker config: {exc}") from None
    return await asyncio.to_thread(load_model, spec.for_device(device))


def device_type(model: ServedModel) -> str:
    """Where the model scores, as `batching.batch_rows` sizes passes for it: a model in this
    process names its device (``cpu``, ``cuda``); a model server's is its own, and the batch it
    is sent keeps the CPU's cap unless the config sets one."""
    device = getattr(model, "device", None)
    return str(getattr(device, "type", "cpu"))
