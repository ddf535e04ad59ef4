"""Benchmark: what a worker pays to turn a ranking request's body into the model's arrays, msgpack
columns against JSON, per candidate, at 2,000 candidates; and the bytes each body takes.

The timed step is the worker's own, from body bytes to float32 dense and int64[n, k] sparse:
`workers.wire.decode_rank_request` then `workers.wire.model_inputs`. JSON parses every number
from text, builds one struct per candidate and walks them again; msgpack copies four columns
and checks each with one vectorised pass. Both run interleaved, one request each per round, in
the same process, so a noisy machine slows both and the ratio (JSON's cost over msgpack's)
stays meaningful. The target is msgpack at least 5x cheaper per candidate.

The client's side is reported beside it, not judged: building the body from `Candidate`
structs (msgpack gathers them into columns, which costs more than JSON's encoder), and
reading the response (2,000 scores) in each encoding.

    python -m bench.transport [candidates]     # prints one JSON line
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from workers.api import Candidate, RankRequest, RankResponse, ServerState
from workers.wire import (
    CONTENT_TYPES,
    Encoding,
    decode_rank_request,
    decode_rank_response,
    encode_rank_request,
    encode_rank_response,
    model_inputs,
)

TARGET_RATIO = 5.0
#: The baseline ranker's default input shape (`workers.runtime.models.ModelConfig`, not
#: imported: it brings torch).
NUM_DENSE = 13
NUM_SPARSE = 8
WARM_UP = 20


def _request(n: int, seed: int = 1) -> RankRequest:
    rng = random.Random(seed)
    return RankRequest(
        request_id="bench", segment="casual", value=1.0, deadline_ms=100.0, gain=0.1,
        dense=[rng.uniform(-3.0, 3.0) for _ in range(NUM_DENSE)], base_count=min(64, n),
        candidates=[Candidate(id=rng.randrange(1 << 40),
                              sparse=[rng.randrange(1 << 31) for _ in range(NUM_SPARSE)],
                              prior=rng.random()) for _ in range(n)])


def _response(n: int, seed: int = 2) -> RankResponse:
    rng = random.Random(seed)
    return RankResponse(request_id="bench", model="baseline",
                        scores=[rng.random() for _ in range(n)], scored=n,
                        optional_scored=n - min(64, n), optional_shed=0,
                        server=ServerState(queue_delay_ms=0.4, in_flight=3, shedding_level=0))


def _timed(step: Callable[[], object]) -> int:
    started = time.perf_counter_ns()
    step()
    return time.perf_counter_ns() - started


def run(candidates: int = 2000, rounds: int = 300) -> dict[str, Any]:
    """Time `rounds` decodes of one request of `candidates` in each encoding, interleaved;
    medians are per candidate."""
    request, response = _request(candidates), _response(candidates)
    encodings: tuple[Encoding, ...] = ("json", "msgpack")
    bodies = {e: encode_rank_request(request, e) for e in encodings}
    answers = {e: encode_rank_response(response, e) for e in encodings}

    def worker_side(encoding: Encoding) -> object:
        return model_inputs(decode_rank_request(bodies[encoding], encoding, 1 << 24),
                            NUM_DENSE, NUM_SPARSE, "baseline")

    steps: dict[str, Callable[[], object]] = {}
    for e in encodings:
        steps[f"decode_{e}"] = partial(worker_side, e)
        steps[f"encode_{e}"] = partial(encode_rank_request, request, e)
        steps[f"response_{e}"] = partial(decode_rank_response, answers[e], CONTENT_TYPES[e],
                                         1 << 24)
    for _ in range(WARM_UP):
        for step in steps.values():
            step()
    samples: dict[str, list[int]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            samples[name].append(_timed(step))
    per_candidate = {name: statistics.median(ns) / candidates for name, ns in samples.items()}
    ratio = per_candidate["decode_json"] / per_candidate["decode_msgpack"]
    return {
        "bench": "transport",
        "candidates": candidates,
        "rounds": rounds,
        "shape": {"dense": NUM_DENSE, "sparse": NUM_SPARSE},
        "decode_ns_per_candidate": {e: round(per_candidate[f"decode_{e}"], 2)
                                    for e in encodings},
        "decode_us_per_request": {e: round(per_candidate[f"decode_{e}"] * candidates / 1000, 1)
                                  for e in encodings},
        "json_vs_msgpack_decode": round(ratio, 2),
        "request_bytes": {e: len(b) for e, b in bodies.items()},
        "request_bytes_per_candidate": {e: round(len(b) / candidates, 1)
                                        for e, b in bodies.items()},
        "client_encode_ns_per_candidate": {e: round(per_candidate[f"encode_{e}"], 2)
                                           for e in encodings},
        "response_bytes": {e: len(b) for e, b in answers.items()},
        "client_response_decode_ns_per_candidate": {
            e: round(per_candidate[f"response_{e}"], 2) for e in encodings},
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO,
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    result = run(int(args[0]) if args else 2000)
    print(json.dumps(result))
    return 0 if result["meets_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
