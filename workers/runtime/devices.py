"""Which device a replica scores on, from the accelerator its pool lends.

A pool id names its accelerator (``region/service/model/accelerator/tier``), and the control
plane plans on it: a lent unit of ``a100`` is costed, granted and reclaimed as one. A replica
whose process runs elsewhere (a ``cpu`` pool's worker that found a GPU and took it, an ``l4``
pool's worker on an H100 node, or one with no GPU at all) would report that pool's cost from
hardware it does not have, and every plan built on that cost would be wrong. So the worker
settles its device from the pool's accelerator before it loads the model, and refuses to start
when the two disagree, naming the keys to change.

- ``cpu``: the model runs on the CPU (``model.device`` ``auto`` or ``cpu``).
- A GPU model the capacity agent knows (``h100``, ``l4``, ... as ``platform.gpu_model``
  reads product names): the process must see a CUDA device of that model.
- Any other name (``gpu``, a site's own): any CUDA device.

A test or staging fleet of CPUs carrying a GPU pool's ids says so
(``WorkerConfig.accelerator_stand_in``): then ``model.device`` alone decides.

Pure: the CUDA device's name (or None) is passed in.
"""

from __future__ import annotations

from typing import Literal

from workers.capacity.platform import GPU_MODELS, gpu_model

Device = Literal["cpu", "cuda"]


class DeviceMismatch(ValueError):
    """The process's hardware is not what its pool lends; the message names the keys."""


def device_for_pool(accelerator: str, choice: str, cuda_name: str | None) -> Device:
    """The device a replica of a pool lending ``accelerator`` scores on, given
    ``model.device`` (``auto``, ``cpu`` or ``cuda``) and the CUDA device this process sees
    (its product name, None without one)."""
    wanted = accelerator.strip().lower()
    if wanted == "cpu":
        if choice == "cuda":
            raise DeviceMismatch(
                "`model.device` is cuda and the pool's `accelerator` is cpu: a cpu pool's "
                "units are cores, and a GPU would report their cost wrong. Set `accelerator` "
                "to the GPU's model (e.g. l4) or `model.device` to auto")
        return "cpu"
    if choice == "cpu":
        raise DeviceMismatch(
            f"`model.device` is cpu and the pool's `accelerator` is {accelerator}: set "
            "`accelerator` to cpu for a replica that scores on the CPU, or `model.device` "
            "to auto")
    if cuda_name is None:
        raise DeviceMismatch(
            f"the pool's `accelerator` is {accelerator} and this process sees no CUDA "
            "device: run it where one is visible (CUDA_VISIBLE_DEVICES, the pod's "
            "nvidia.com/gpu limit), or set `accelerator` to cpu")
    if wanted in GPU_MODELS and gpu_model(cuda_name) != wanted:
        raise DeviceMismatch(
            f"the pool's `accelerator` is {accelerator} and this process's GPU is "
            f"{cuda_name}: its cost would be booked to the wrong accelerator. Set "
            f"`accelerator` to {gpu_model(cuda_name) or 'the GPU model'}, or run it on "
            f"{accelerator} hardware")
    return "cuda"


def stand_in_device(choice: str, cuda_name: str | None) -> Device:
    """The device ``model.device`` alone gives, ``auto`` taking CUDA where there is one: a
    replica that stands in for its pool's accelerator (a test or staging fleet), and a model
    loaded outside any pool (`models.pick_device`)."""
    return "cuda" if choice == "cuda" or (choice == "auto" and cuda_name is not None) else "cpu"
