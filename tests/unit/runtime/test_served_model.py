"""What a worker serves with (``workers.runtime.served_model``): the batch cap follows the
device a model names, and nothing scores before a model is loaded."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from workers.runtime.served_model import NotLoaded, device_type


def test_a_model_in_process_names_its_device_and_a_model_server_counts_as_the_cpu() -> None:
    in_process: Any = SimpleNamespace(device=SimpleNamespace(type="cuda"))
    server: Any = SimpleNamespace(source="oip")
    assert device_type(in_process) == "cuda"
    assert device_type(server) == "cpu"


def test_nothing_scores_before_the_model_is_loaded() -> None:
    with pytest.raises(RuntimeError, match="no model loaded"):
        NotLoaded().score(np.zeros((1, 1), dtype=np.float32))
