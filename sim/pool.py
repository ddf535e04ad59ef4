"""Independent simulation runs, ``jobs`` at a time in processes of their own.

Runs share nothing but their inputs and each is seeded, so where one ran does not change it;
``spawn`` rather than ``fork``, so no process inherits another run's state or threads."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Hashable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")


def each(calls: Mapping[K, tuple[Callable[..., R], tuple[Any, ...]]],
         jobs: int) -> Iterator[tuple[K, R]]:
    """(key, result) of every call as it finishes; in this process when ``jobs`` <= 1."""
    if jobs <= 1 or len(calls) <= 1:
        for key, (fn, args) in calls.items():
            yield key, fn(*args)
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(jobs, len(calls)), mp_context=context) as pool:
        futures = {pool.submit(fn, *args): key for key, (fn, args) in calls.items()}
        for future in as_completed(futures):
            yield futures[future], future.result()
