"""Ranking models the worker serves: two reference torch models and loading of user models.

Unless the worker config declares the model's inputs (``[[model.inputs]]``, see
`workers.features`), every model has the same calling convention, so the batcher, the exported
files and user models are interchangeable: ``forward(dense: float32[B, num_dense], sparse:
int64[B, num_sparse]) -> float32[B]`` scores in (0, 1). Row ``b`` is one candidate: the
request's dense features and the candidate's sparse ids, one id per sparse feature (hashed into
its table inside the model, so any non-negative id is valid). A user model with other inputs
(per-candidate dense features, multi-hot ids) declares them, and start checks the file against
the declaration (`load_model`).

- :class:`BaselineRanker` is DLRM-shaped: an EmbeddingBag per sparse feature, a bottom MLP on
  the dense features, pairwise dot-product interaction, a top MLP. It is what baseline replicas
  serve for all traffic.
- :class:`PowerfulRanker` adds DCN-v2 cross layers over all features and a wider, deeper MLP:
  several times the compute per row, the "better model" the SBM lever buys on harvested
  accelerators.

Initialisation is deterministic in ``ModelConfig.seed`` and leaves the global RNG untouched.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import msgspec
import numpy as np
import torch
from msgspec import Meta
from torch import Tensor, nn
from torch.export.passes import move_to_device_pass
from torch.nn import functional as F

from workers.features import (
    Arg,
    Declared,
    Input,
    Signature,
    SignatureMismatch,
    SpecError,
    assemble,
    check_model_args,
    example_rows,
)
from workers.runtime.devices import stand_in_device
from workers.runtime.oip_wire import OipSpec
from workers.runtime.onnx_model import OnnxSession, check_graph, execution_device

ModelName = Literal["baseline", "powerful"]
Width = Annotated[int, Meta(ge=1, le=65_536)]


class ModelConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Sizes of the reference models (and the input shape a loaded user model must accept)."""

    num_dense: Annotated[int, Meta(ge=1, le=4096)] = 13
    num_sparse: Annotated[int, Meta(ge=1, le=256)] = 8
    rows_per_table: Annotated[int, Meta(ge=2, le=100_000_000)] = 10_000
    embedding_dim: Annotated[int, Meta(ge=1, le=1024)] = 16
    #: Bottom MLP widths on the dense features; the last is forced to ``embedding_dim``.
    bottom_mlp: tuple[Width, ...] = (64, 32)
    top_mlp: tuple[Width, ...] = (64, 32)
    #: PowerfulRanker only: cross layers over [bottom output, every embedding].
    cross_layers: Annotated[int, Meta(ge=0, le=16)] = 2
    #: PowerfulRanker only: its deep tower (applied after the cross layers).
    deep_mlp: tuple[Width, ...] = (128, 64)
    seed: int = 0


class ModelSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Which model a worker serves: a reference model by name, a user file by path, or a
    model server the team already runs (``backend = "oip"``, ``[model.oip]``).

    ``name`` is the model kind reported on the wire (``baseline`` or ``powerful``) whichever
    way the weights come; with ``path`` or ``oip`` set, ``config`` only states the input shape.
    """

    name: ModelName = "baseline"
    #: Where rows are scored: ``torch`` in this process (torch, or onnxruntime for an ``.onnx``
    #: file), or ``oip``, a model server over the Open Inference Protocol
    #: (``workers.runtime.oip``); admission, batching and shedding stay in the worker either way.
    backend: Literal["torch", "oip"] = "torch"
    oip: OipSpec | None = None
    path: str | None = None
    #: A file per device the model is built for (``[model.artifacts]``, ``cpu`` and
    #: ``cuda``): an ONNX graph for the CPU beside a ``torch.export`` program for CUDA, say.
    #: The worker loads the one for the device its pool's accelerator gives it (`devices`),
    #: else ``path``; one pool image then serves on any accelerator the model has a file for.
    artifacts: dict[Literal["cpu", "cuda"], str] = {}
    config: ModelConfig = ModelConfig()
    #: What the model takes, in ``forward``'s order (``[[model.inputs]]``); none: the fixed
    #: ``dense[B, config.num_dense], sparse[B, config.num_sparse]``.
    inputs: tuple[Input, ...] = ()
    #: ``auto``: the pool's accelerator decides (``cpu`` on the CPU, any other on CUDA);
    #: either way the worker refuses hardware its pool does not lend (`devices`).
    device: Literal["auto", "cpu", "cuda"] = "auto"
    #: Intra-op threads for torch; 0 picks one per core minus one for the event loop.
    threads: Annotated[int, Meta(ge=0, le=256)] = 0
    #: Before it takes traffic, the model runs forward passes of 2, 4, ... up to this many rows:
    #: a fresh process allocates and picks kernels on its first passes of each size, and a
    #: replica that joins a pool mid-run must not spend them on live requests.
    warmup_rows: Annotated[int, Meta(ge=2, le=1 << 16)] = 64

    def for_device(self, device: Literal["cpu", "cuda"]) -> ModelSpec:
        """This spec settled on ``device``, with the file built for it; `ModelLoadError`
        when the model has files for other devices only."""
        path = self.artifacts.get(device, self.path)
        if self.artifacts and path is None:
            have = ", ".join(sorted(self.artifacts))
            raise ModelLoadError(
                f"bad worker config at `model.artifacts`: no file for {device}, the device "
                f"this replica's pool gives it (it has {have}); add `model.artifacts.{device}` "
                "or `model.path`, or run it in a pool of the accelerator it is built for")
        return msgspec.structs.replace(self, device=device, path=path)

    def signature(self) -> Signature:
        """The model's inputs as declared, or the fixed signature; `SpecError` names the key
        of a declaration that cannot be served."""
        if not self.inputs:
            return Signature.fixed(self.config.num_dense, self.config.num_sparse)
        return Signature.of(self.inputs)


def _mlp(widths: list[int], final_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(a, b))
        if final_activation or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class _SparseDense(nn.Module):
    """What both rankers share: hashed embeddings per sparse feature and a dense bottom MLP."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.rows_per_table = cfg.rows_per_table
        self.embeddings = nn.ModuleList(
            nn.EmbeddingBag(cfg.rows_per_table, cfg.embedding_dim, mode="sum")
            for _ in range(cfg.num_sparse))
        self.bottom = _mlp([cfg.num_dense, *cfg.bottom_mlp, cfg.embedding_dim], True)

    def features(self, dense: Tensor, sparse: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Bottom-MLP output [B, E] and one pooled embedding [B, E] per sparse feature."""
        ids = torch.remainder(sparse, self.rows_per_table)
        # One id per bag, so a bag's sum is its row: a plain lookup in the bag's weights. The
        # bag's own forward builds its offsets with `arange` on the device it is traced on,
        # which a TorchScript trace bakes in, and the file then fails on any other device.
        bags = cast(list[nn.EmbeddingBag], list(self.embeddings))
        embedded = [F.embedding(ids[:, i], bag.weight) for i, bag in enumerate(bags)]
        return self.bottom(dense), embedded


class BaselineRanker(_SparseDense):
    """DLRM: embeddings + bottom MLP, pairwise dot interactions, top MLP, sigmoid."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        n = cfg.num_sparse + 1
        rows, cols = torch.triu_indices(n, n, offset=1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)
        pairs = n * (n - 1) // 2
        self.pair_rows: Tensor
        self.pair_cols: Tensor
        self.top = _mlp([cfg.embedding_dim + pairs, *cfg.top_mlp, 1], False)

    def forward(self, dense: Tensor, sparse: Tensor) -> Tensor:
        bottom, embedded = self.features(dense, sparse)
        stacked = torch.stack([bottom, *embedded], dim=1)            # [B, n, E]
        dots = torch.bmm(stacked, stacked.transpose(1, 2))           # [B, n, n]
        interactions = dots[:, self.pair_rows, self.pair_cols]       # [B, n(n-1)/2]
        logits = self.top(torch.cat([bottom, interactions], dim=1))
        return torch.sigmoid(logits.squeeze(1))


class _CrossLayer(nn.Module):
    """DCN-v2: x_{l+1} = x0 * (W x_l + b) + x_l (explicit bounded-degree feature crosses)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x0: Tensor, x: Tensor) -> Tensor:
        return x0 * self.linear(x) + x


class PowerfulRanker(_SparseDense):
    """DCN-v2 over every feature, then a deep tower: several times DLRM's compute per row."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        width = cfg.embedding_dim * (cfg.num_sparse + 1)
        self.cross = nn.ModuleList(_CrossLayer(width) for _ in range(cfg.cross_layers))
        self.deep = _mlp([width, *cfg.deep_mlp, 1], False)

    def forward(self, dense: Tensor, sparse: Tensor) -> Tensor:
        bottom, embedded = self.features(dense, sparse)
        x0 = torch.cat([bottom, *embedded], dim=1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        return torch.sigmoid(self.deep(x).squeeze(1))


def build_reference(name: ModelName, cfg: ModelConfig) -> nn.Module:
    """A reference model with deterministic weights; the global RNG is left as it was."""
    cls = {"baseline": BaselineRanker, "powerful": PowerfulRanker}[name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = cls(cfg)
    return model.eval()


def example_inputs(cfg: ModelConfig, rows: int = 4, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Random inputs of the model's shape (for export, tests and benchmarks)."""
    gen = torch.Generator().manual_seed(seed)
    dense = torch.randn(rows, cfg.num_dense, generator=gen)
    sparse = torch.randint(0, 2**31 - 1, (rows, cfg.num_sparse), generator=gen)
    return dense, sparse


def export_model(model: nn.Module, cfg: ModelConfig, path: str | Path) -> Path:
    """Save ``model`` as a ``torch.export`` program with a dynamic batch dimension (.pt2)."""
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    program = torch.export.export(model.eval(), example_inputs(cfg),
                                  dynamic_shapes={"dense": {0: batch}, "sparse": {0: batch}})
    path = Path(path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "No complete tensor found")  # archive packing note
        torch.export.save(program, str(path))
    return path


def export_onnx(model: nn.Module, cfg: ModelConfig, path: str | Path) -> Path:
    """Save ``model`` as ONNX (.onnx) with a dynamic batch, for onnxruntime: inputs ``dense``
    and ``sparse``, one output ``score[B]``, the weights inside the file.

    torch's exporter goes through ``torch.export`` as `export_model` does (the same dynamic
    batch), then onnxscript (the ``export`` extra) translates the program."""
    import logging

    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    path = Path(path)
    # The exporter logs a warning per torchvision op it cannot register (torchvision is not
    # installed, and none of them is used here) and warns that the two inputs share `batch`.
    registry = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registry.level
    registry.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.filterwarnings("ignore", "# The axis name")
            program = torch.onnx.export(
                model.eval(), example_inputs(cfg), dynamo=True, verbose=False,
                input_names=["dense", "sparse"], output_names=["score"],
                dynamic_shapes={"dense": {0: batch}, "sparse": {0: batch}})
    finally:
        registry.setLevel(level)
    assert program is not None  # dynamo=True always returns the program
    program.save(str(path), external_data=False)
    return path


def trace_model(model: nn.Module, cfg: ModelConfig, path: str | Path) -> Path:
    """Save ``model`` as traced TorchScript (the older format many pipelines still produce)."""
    path = Path(path)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated, still widely deployed
        traced = torch.jit.trace(model.eval(), example_inputs(cfg))
        torch.jit.save(traced, str(path))
    return path


def count_flops(model: nn.Module, cfg: ModelConfig, rows: int = 64) -> int:
    """Floating-point operations of one forward pass over ``rows`` rows (torch's counter)."""
    from torch.utils.flop_counter import FlopCounterMode

    dense, sparse = example_inputs(cfg, rows)
    counter = FlopCounterMode(display=False)
    with counter, torch.inference_mode():
        model(dense, sparse)
    return int(counter.get_total_flops())


def default_threads() -> int:
    """One intra-op thread per usable core, less one kept for the event loop and Kafka."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


def configure_threads(threads: int) -> int:
    """Set torch's intra-op threads (0 = default_threads()) and one inter-op thread."""
    n = threads or default_threads()
    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # already set, or parallel work already ran
        torch.set_num_interop_threads(1)
    return n


def cuda_device_name() -> str | None:
    """The product name of the CUDA device this process scores on (None: it sees none)."""
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def pick_device(choice: str) -> torch.device:
    return torch.device(stand_in_device(choice, cuda_device_name()))


@dataclass
class LoadedModel:
    """A model ready to score rows on its device; ``score`` is called from one thread only."""

    #: A torch module, program or TorchScript file taking tensors, or an `OnnxSession`
    #: (onnxruntime) taking numpy arrays.
    module: Any
    kind: ModelName
    config: ModelConfig
    device: torch.device
    source: str
    #: The tensors ``forward`` takes (`Signature.args`); None: the fixed signature's.
    args: tuple[Arg, ...] | None = None
    #: Warm forward passes timed at load, (rows, ms) each: the replica's measured cost before
    #: its first request (`Admission.calibrate`).
    calibration: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if self.args is None:
            fixed = Signature.fixed(self.config.num_dense, self.config.num_sparse)
            self.args = tuple(fixed.args())

    def score(self, *inputs: np.ndarray) -> np.ndarray:
        """Scores (float32[B]) of rows given as numpy arrays of the model's shapes, in its
        signature's order (``dense, sparse`` unless it declares its inputs)."""
        assert self.args is not None
        if isinstance(self.module, OnnxSession):
            return self.module.score(*(np.ascontiguousarray(x, dtype=arg.dtype)
                                       for x, arg in zip(inputs, self.args, strict=True)))
        with torch.inference_mode():
            tensors = [torch.from_numpy(np.ascontiguousarray(x, dtype=arg.dtype)).to(self.device)
                       for x, arg in zip(inputs, self.args, strict=True)]
            out = self.module(*tensors)
            return out.reshape(-1).float().cpu().numpy()


class ModelLoadError(RuntimeError):
    """The model file or spec cannot be turned into a servable model; the message says why."""


def load_model(spec: ModelSpec) -> LoadedModel:
    """The model of ``spec`` on its device, checked and warmed up by forward passes.

    ``.pt2`` files are ``torch.export`` programs, ``.onnx`` files ONNX graphs run by
    onnxruntime (`workers.runtime.onnx_model`); any other file is tried as TorchScript. The
    model's inputs must be its spec's (``model.inputs``, or the fixed signature): a program's
    declared inputs (their count; a ``torch.export`` program's or ONNX graph's dtypes and
    fixed dimensions too, and an ONNX graph's output) are compared with the spec first, naming
    the input that differs, then every warm-up pass feeds it rows built from the spec
    (`workers.features.example_rows`).
    """
    threads = configure_threads(spec.threads)
    device = pick_device(spec.device)
    try:
        signature = spec.signature()
    except SpecError as exc:
        raise ModelLoadError(f"bad worker config at {exc}") from None
    if spec.path is None:
        if signature.declared:
            raise ModelLoadError("bad worker config at `model.inputs`: the reference models "
                                 "take the fixed dense and sparse inputs; declare inputs for "
                                 "a model file (`model.path`) or server")
        module: Any = build_reference(spec.name, spec.config).to(device)
        source = f"reference:{spec.name}"
    elif Path(spec.path).suffix == ".onnx":
        module, device = _load_onnx(Path(spec.path), spec.device, threads)
        source = spec.path
        try:
            check_graph(module.inputs, module.outputs, signature, source)
        except SignatureMismatch as exc:
            raise ModelLoadError(str(exc)) from None
    else:
        module, declared = _load_file(Path(spec.path), device)
        source = spec.path
        try:
            check_model_args(declared, signature, source)
        except SignatureMismatch as exc:
            raise ModelLoadError(str(exc)) from None
    loaded = LoadedModel(module, spec.name, spec.config, device, source,
                         tuple(signature.args()))
    for rows in warmup_sizes(spec.warmup_rows):
        inputs = assemble([example_rows(signature, rows, seed=rows)])
        try:
            scores = loaded.score(*inputs)
        except Exception as exc:
            raise ModelLoadError(f"{source} does not accept {signature.describe()} (the spec, "
                                 f"`{signature.where}`): {exc}") from exc
        if scores.shape != (rows,):
            raise ModelLoadError(f"{source} returned shape {tuple(scores.shape)} for {rows} "
                                 "rows; expected one score per row")
    loaded.calibration = _timed_passes(loaded, signature, spec.warmup_rows)
    return loaded


def _timed_passes(loaded: LoadedModel, signature: Signature,
                  max_rows: int) -> tuple[tuple[int, float], ...]:
    """Each warm-up size from 16 rows up scored once more, warm, and timed: what a pass costs
    here (device, threads, CPU quota), before any request measures it."""
    timed = []
    for rows in warmup_sizes(max_rows):
        if rows < min(16, max_rows):
            continue
        inputs = assemble([example_rows(signature, rows, seed=rows)])
        start = time.perf_counter()
        loaded.score(*inputs)
        timed.append((rows, (time.perf_counter() - start) * 1000.0))
    return tuple(timed)


def warmup_sizes(max_rows: int) -> list[int]:
    """Batch sizes of the warm-up passes: powers of two from 2, then ``max_rows`` itself."""
    sizes = [1 << k for k in range(1, max_rows.bit_length()) if 1 << k < max_rows]
    return [*sizes, max_rows]


def _load_file(path: Path, device: torch.device) -> tuple[Any, list[Declared]]:
    """The model in a file, and its inputs as the file declares them."""
    if not path.is_file():
        raise ModelLoadError(f"model file {path} does not exist")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit.load is deprecated
            warnings.filterwarnings("ignore", "No complete tensor found")  # export archive note
            if path.suffix == ".pt2":
                program = torch.export.load(str(path))
                declared = _program_inputs(program)
                if device.type != "cpu":
                    # A program's graph names the device it was exported on (an embedding
                    # bag's offsets, say); moving its parameters alone left those on the CPU.
                    program = move_to_device_pass(program, device)
                return program.module(), declared
            script = torch.jit.load(str(path), map_location=device).eval()
    except Exception as exc:
        raise ModelLoadError(f"cannot load model {path}: {exc}") from exc
    # TorchScript keeps forward's argument names, not their dtypes or shapes: the warm-up
    # passes are what check those.
    arguments = script.forward.schema.arguments[1:]    # after self
    return script, [Declared(a.name) for a in arguments]


def _load_onnx(path: Path, choice: str, threads: int) -> tuple[OnnxSession, torch.device]:
    """An ONNX file open in onnxruntime, and the device it runs on (`execution_device`)."""
    if not path.is_file():
        raise ModelLoadError(f"model file {path} does not exist")
    try:
        device = execution_device(choice, torch.cuda.is_available(), OnnxSession.providers())
    except ValueError as exc:
        raise ModelLoadError(f"bad worker config at {exc}") from None
    try:
        return OnnxSession(path, device, threads), torch.device(device)
    except Exception as exc:
        raise ModelLoadError(f"cannot load model {path}: {exc}") from exc


def _program_inputs(program: Any) -> list[Declared]:
    """A ``torch.export`` program's user inputs: each placeholder's dtype and shape, a
    dimension it exported as dynamic (a symbol) as None."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    declared = []
    for name in program.graph_signature.user_inputs:
        value = placeholders[name].meta.get("val") if name in placeholders else None
        if not isinstance(value, torch.Tensor):
            declared.append(Declared(name))
            continue
        shape = tuple(d if isinstance(d, int) else None for d in value.shape)
        declared.append(Declared(name, str(value.dtype).removeprefix("torch."), shape))
    return declared
