"""What a model takes: its named inputs, and the checks every request and model must pass.

A ranking model scores ``B`` candidate rows in one forward pass. Its inputs (``[[model.inputs]]``
in the worker config, in the order ``forward`` takes them) are each one of four kinds:

==================  ==============================  =====================================
kind                what a request sends            what the model gets (``B`` rows)
==================  ==============================  =====================================
``request_dense``   ``size`` values for the request  ``float[B, size]``, broadcast over its
                                                     candidates
``candidate_dense`` ``size`` values per candidate    ``float[B, size]``
``sparse``          ``size`` ids per candidate       ``int[B, size]`` (single-hot: one id
                                                     per feature)
``multi_hot``       any number of ids per candidate  two tensors, ``int[nnz]`` values and
                    (values + ``n + 1`` offsets)     ``int[B + 1]`` offsets
==================  ==============================  =====================================

Multi-hot ids follow TorchRec's KeyedJaggedTensor convention: one flat array of ids and offsets
where candidate ``i``'s ids are ``values[offsets[i]:offsets[i + 1]]`` (``offsets[0] == 0``,
``offsets[-1] == len(values)``); ``nn.EmbeddingBag(..., include_last_offset=True)`` takes them as
they are. With no ``[[model.inputs]]`` a model takes the fixed signature every Surplus model has
had, ``forward(dense[B, num_dense], sparse[B, num_sparse])`` (`Signature.fixed`).

Pure numpy and msgspec, no torch and no HTTP: the worker checks each request against the
signature here (`check_request_dense` and its siblings) so a wrong width is a 422 naming the
field rather than a failed batch that takes other requests' baseline rows with it, and start
compares what a model file or server declares with the same signature (`check_model_args`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec
import numpy as np
from msgspec import Meta

Kind = Literal["request_dense", "candidate_dense", "sparse", "multi_hot"]
DType = Literal["float32", "float64", "int32", "int64"]
#: An input's name: also the model server's tensor name and a JSON key, so kept plain.
InputName = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]

#: The bounds every dense value keeps (the fixed signature's, `workers.api.Bounded`).
DENSE_LIMIT = 1e9
#: Ids without a declared cardinality: any non-negative id of the model's dtype (the model
#: hashes it into its table, as the reference models do).
_ID_MAX = {"int32": 2**31 - 1, "int64": 2**63 - 1}
_DENSE_KINDS = ("request_dense", "candidate_dense")


class SpecError(ValueError):
    """A model spec that cannot be served; the message names the config key."""


class SignatureMismatch(ValueError):
    """A model (file or server) that does not take what its spec declares; names the input."""


class FeatureError(ValueError):
    """A request whose features do not fit the model's spec (HTTP 422); names the field."""


class Input(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One input of the model, a ``[[model.inputs]]`` table of the worker config."""

    #: The input's name: the key of ``$.features`` a request sends it under.
    name: InputName
    kind: Kind
    #: Values per request (``request_dense``) or per candidate (``candidate_dense``), ids per
    #: candidate (``sparse``); none for ``multi_hot``, whose candidates have any number.
    size: Annotated[int, Meta(ge=1, le=4096)] | None = None
    #: What the model's tensor holds: ``float32`` (dense kinds) and ``int64`` (id kinds) unless
    #: set; a request may send either width of the same kind, and the worker casts.
    dtype: DType | None = None
    #: Ids only: the table's row count, so an id at or past it is refused with the request
    #: (an out-of-range id would fail the whole batch, other requests' baseline rows included).
    #: None: any non-negative id of the dtype, for a model that hashes its ids.
    cardinality: Annotated[int, Meta(ge=1, le=2**63 - 1)] | None = None

    def __post_init__(self) -> None:
        ids = self.kind in ("sparse", "multi_hot")
        if self.kind == "multi_hot" and self.size is not None:
            raise ValueError(f"input {self.name!r}: a multi_hot input has no `size` (each "
                             "candidate has any number of ids)")
        if self.kind != "multi_hot" and self.size is None:
            raise ValueError(f"input {self.name!r}: a {self.kind} input needs `size`")
        if self.dtype is not None and self.dtype.startswith("int") != ids:
            raise ValueError(f"input {self.name!r}: dtype {self.dtype} does not fit a {self.kind} "
                             f"input ({'int32 or int64' if ids else 'float32 or float64'})")
        if self.cardinality is not None and not ids:
            raise ValueError(f"input {self.name!r}: `cardinality` is for ids, not {self.kind}")

    @property
    def ids(self) -> bool:
        """Whether the input holds ids (``sparse``, ``multi_hot``) rather than dense values."""
        return self.kind in ("sparse", "multi_hot")

    @property
    def model_dtype(self) -> np.dtype[np.generic]:
        """The numpy dtype of the model's tensor."""
        return np.dtype(self.dtype or ("int64" if self.ids else "float32"))

    @property
    def id_max(self) -> int:
        """The largest id this input takes."""
        if self.cardinality is not None:
            return min(self.cardinality - 1, _ID_MAX[self.model_dtype.name])
        return _ID_MAX[self.model_dtype.name]


@dataclass(frozen=True, slots=True)
class Arg:
    """One tensor the model's ``forward`` takes, in order: ``shape`` has None where the size
    varies (the batch; a multi-hot input's value count)."""

    name: str
    field: str       # the input it comes from
    key: str         # where that input is declared in the worker config
    dtype: np.dtype[np.generic]
    shape: tuple[int | None, ...]

    def describe(self, rows: int | str = "B") -> str:
        """``name[B, 13] float32``, as error messages say it."""
        dims = ", ".join(str(rows) if d is None else str(d) for d in self.shape)
        return f"{self.name}[{dims}] {self.dtype.name}"


@dataclass(frozen=True, slots=True)
class Signature:
    """A model's inputs in ``forward``'s order, checked as a whole (see `Signature.of`)."""

    inputs: tuple[Input, ...]
    #: Declared by ``[[model.inputs]]`` (False: the fixed signature from ``model.config``).
    declared: bool = True

    @classmethod
    def of(cls, inputs: Sequence[Input]) -> Signature:
        """The signature of declared inputs; `SpecError` names the key of a bad one."""
        if not inputs:
            raise SpecError("`model.inputs`: declare at least one input")
        seen: dict[str, str] = {}
        signature = cls(tuple(inputs))
        for arg in signature.args():
            if arg.name in seen:
                raise SpecError(f"`{arg.key}.name`: {arg.name!r} is also the name of "
                                f"{seen[arg.name]}; every tensor the model takes needs its own")
            seen[arg.name] = f"`{arg.key}`"
        return signature

    @classmethod
    def fixed(cls, num_dense: int, num_sparse: int) -> Signature:
        """What every model takes unless its config declares inputs: ``forward(dense[B,
        num_dense], sparse[B, num_sparse])``, the request's dense features broadcast to its
        candidates and one id per sparse feature."""
        return cls((Input(name="dense", kind="request_dense", size=num_dense),
                    Input(name="sparse", kind="sparse", size=num_sparse)), declared=False)

    @property
    def where(self) -> str:
        """The worker config's key that declares the signature."""
        return "model.inputs" if self.declared else "model.config"

    def key(self, index: int) -> str:
        """Where input ``index`` is declared in the worker config."""
        if self.declared:
            return f"model.inputs[{index}]"
        return f"model.config.{('num_dense', 'num_sparse')[index]}"

    def args(self) -> list[Arg]:
        """The tensors ``forward`` takes, in order: one per input, two per multi-hot one
        (``{name}_values`` and ``{name}_offsets``)."""
        out = []
        for i, inp in enumerate(self.inputs):
            key = self.key(i)
            if inp.kind == "multi_hot":
                out += [Arg(f"{inp.name}_values", inp.name, key, inp.model_dtype, (None,)),
                        Arg(f"{inp.name}_offsets", inp.name, key, np.dtype(np.int64), (None,))]
            else:
                out.append(Arg(inp.name, inp.name, key, inp.model_dtype, (None, inp.size)))
        return out

    def names(self) -> list[str]:
        return [inp.name for inp in self.inputs]

    def describe(self, rows: int | str = "B") -> str:
        """Every tensor the model takes, as error messages say them."""
        return ", ".join(arg.describe(rows) for arg in self.args())


# -- one request's rows --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Jagged:
    """Multi-hot ids of ``n`` candidates: candidate ``i``'s ids are
    ``values[offsets[i]:offsets[i + 1]]`` (``offsets`` has ``n + 1`` entries, from 0)."""

    values: np.ndarray
    offsets: np.ndarray

    @classmethod
    def from_lists(cls, ids: Sequence[Sequence[int]], dtype: str = "int64") -> Jagged:
        """From one list of ids per candidate."""
        lengths = np.fromiter((len(row) for row in ids), dtype=np.int64, count=len(ids))
        flat = [i for row in ids for i in row]
        return cls.from_lengths(np.asarray(flat, dtype=dtype), lengths)

    @classmethod
    def from_lengths(cls, values: np.ndarray, lengths: np.ndarray) -> Jagged:
        """From the flat ids and each candidate's count of them (TorchRec's ``lengths``)."""
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(np.asarray(values), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def take(self, start: int, stop: int) -> Jagged:
        """Candidates ``start`` to ``stop``, their offsets rebased to 0."""
        offsets = self.offsets[start:stop + 1]
        first = int(offsets[0]) if len(offsets) else 0
        return Jagged(self.values[first:int(offsets[-1]) if len(offsets) else first],
                      offsets - first)


Part = np.ndarray | Jagged


@dataclass(frozen=True, slots=True, eq=False)
class Rows:
    """One request's candidate rows, checked and in the model's dtypes: one part per input in
    the signature's order, a request-dense part as its one vector (broadcast when batched)."""

    count: int
    parts: tuple[Part, ...]
    per_request: tuple[bool, ...]

    @classmethod
    def fixed(cls, dense: np.ndarray, sparse: np.ndarray) -> Rows:
        """Rows of the fixed signature: the request's dense vector and ``[n, k]`` ids."""
        return cls(len(sparse), (dense, sparse), (True, False))

    def take(self, start: int, stop: int) -> Rows:
        """Candidates ``start`` to ``stop`` (a request's baseline or optional rows)."""
        stop = min(stop, self.count)
        parts = tuple(p if shared else p.take(start, stop) if isinstance(p, Jagged)
                      else p[start:stop] for p, shared in zip(self.parts, self.per_request,
                                                               strict=True))
        return Rows(max(0, stop - start), parts, self.per_request)


def assemble(batch: Sequence[Rows]) -> list[np.ndarray]:
    """The model's arguments for the rows of several requests (all of one signature): dense
    vectors broadcast to their rows, rows concatenated, multi-hot offsets rebased."""
    first = batch[0]
    args: list[np.ndarray] = []
    for i, shared in enumerate(first.per_request):
        parts = [rows.parts[i] for rows in batch]
        arrays = [p for p in parts if isinstance(p, np.ndarray)]
        if shared:
            args.append(np.concatenate([np.broadcast_to(p, (rows.count, len(p)))
                                        for p, rows in zip(arrays, batch, strict=True)]))
        elif isinstance(parts[0], Jagged):
            jagged = [p for p in parts if isinstance(p, Jagged)]
            starts = np.cumsum([0] + [len(j.values) for j in jagged[:-1]])
            offsets = [j.offsets[:-1] + s for j, s in zip(jagged, starts, strict=True)]
            offsets.append(np.array([int(starts[-1]) + len(jagged[-1].values)], np.int64))
            args += [np.concatenate([j.values for j in jagged]),
                     np.concatenate(offsets).astype(np.int64, copy=False)]
        else:
            args.append(np.concatenate(arrays))
    return args


def example_rows(signature: Signature, rows: int, seed: int = 0) -> Rows:
    """Random rows of the signature's shapes and dtypes, 0 to 3 ids a multi-hot candidate:
    what start probes a model with before it takes traffic."""
    rng = np.random.default_rng(seed)
    parts: list[Part] = []
    for inp in signature.inputs:
        if inp.kind == "multi_hot":
            lengths = rng.integers(0, 4, rows)
            values = rng.integers(0, inp.id_max, int(lengths.sum()), dtype=np.int64,
                                  endpoint=True)
            parts.append(Jagged.from_lengths(values.astype(inp.model_dtype), lengths))
        elif inp.ids:
            parts.append(rng.integers(0, inp.id_max, (rows, inp.size or 0), dtype=np.int64,
                                      endpoint=True).astype(inp.model_dtype))
        else:
            shape = (inp.size or 0,) if inp.kind == "request_dense" else (rows, inp.size or 0)
            parts.append(rng.standard_normal(shape).astype(inp.model_dtype))
    return Rows(rows, tuple(parts), tuple(i.kind == "request_dense" for i in signature.inputs))


# -- checks of a request's features --------------------------------------------------------------


def _what(inp: Input) -> str:
    return f"{inp.model_dtype.name} {'ids' if inp.ids else 'values'}"


def check_request_dense(inp: Input, values: np.ndarray, path: str) -> np.ndarray:
    """A request-dense feature as the model's vector: exactly ``size`` finite values within
    ±1e9; FeatureError names ``path`` otherwise."""
    if values.ndim != 1 or len(values) != inp.size:
        got = len(values) if values.ndim == 1 else f"shape {list(values.shape)}"
        raise FeatureError(f"`{path}`: expected {inp.size} {_what(inp)}, got {got}")
    return _dense(values, inp, path)


def check_candidate_dense(inp: Input, values: np.ndarray, n: int, path: str) -> np.ndarray:
    """A per-candidate dense feature as the model's ``[n, size]`` rows."""
    if values.shape != (n, inp.size):
        raise FeatureError(f"`{path}`: expected {n} rows (one per candidate) of {inp.size} "
                           f"{_what(inp)}, got shape {list(values.shape)}")
    return _dense(values, inp, path)


def check_sparse(inp: Input, ids: np.ndarray, n: int, path: str) -> np.ndarray:
    """Single-hot ids as the model's ``[n, size]`` rows, each within the input's range."""
    if ids.shape != (n, inp.size):
        raise FeatureError(f"`{path}`: expected {n} rows (one per candidate) of {inp.size} "
                           f"{_what(inp)}, got shape {list(ids.shape)}")
    return _ids(ids, inp, path)


def check_multi_hot(inp: Input, values: np.ndarray, offsets: np.ndarray, n: int,
                    path: str) -> Jagged:
    """Multi-hot ids of ``n`` candidates: ``offsets`` ``[n + 1]``, from 0, never decreasing,
    ending at ``len(values)``; every id within the input's range."""
    if values.ndim != 1:
        raise FeatureError(f"`{path}.values`: expected a flat list of ids, got shape "
                           f"{list(values.shape)}")
    if offsets.shape != (n + 1,):
        raise FeatureError(f"`{path}.offsets`: expected {n + 1} offsets (one per candidate and "
                           f"the end), got shape {list(offsets.shape)}")
    if offsets.dtype.kind not in "iu":
        raise FeatureError(f"`{path}.offsets`: expected integers, got {offsets.dtype.name}")
    if offsets[0] != 0 or offsets[-1] != len(values):
        raise FeatureError(f"`{path}.offsets`: must start at 0 and end at {len(values)} (the "
                           f"number of values), got {int(offsets[0])} .. {int(offsets[-1])}")
    steps = np.diff(offsets.astype(np.int64))
    if steps.size and steps.min() < 0:
        i = int(np.flatnonzero(steps < 0)[0])
        raise FeatureError(f"`{path}.offsets[{i + 1}]` is {int(offsets[i + 1])}, below "
                           f"`{path}.offsets[{i}]` ({int(offsets[i])}): offsets never decrease")
    return Jagged(_ids(values, inp, f"{path}.values"), offsets.astype(np.int64, copy=False))


def _dense(values: np.ndarray, inp: Input, path: str) -> np.ndarray:
    if values.dtype.kind not in "iuf":
        raise FeatureError(f"`{path}`: expected numbers, got {values.dtype.name}")
    bad = ~(np.abs(values) <= DENSE_LIMIT)  # NaN fails the comparison too
    if bad.any():
        value = values.flat[int(np.flatnonzero(bad)[0])].item()
        raise FeatureError(f"`{path}{_index(bad)}` is {value!r}; expected a finite value "
                           f"within ±{DENSE_LIMIT:g}")
    return values.astype(inp.model_dtype, copy=False)


def _ids(ids: np.ndarray, inp: Input, path: str) -> np.ndarray:
    if ids.dtype.kind not in "iu":
        raise FeatureError(f"`{path}`: expected integer ids, got {ids.dtype.name}")
    if ids.size and (ids.min() < 0 or ids.max() > inp.id_max):
        bad = (ids < 0) | (ids > inp.id_max)
        value = ids.flat[int(np.flatnonzero(bad)[0])].item()
        raise FeatureError(f"`{path}{_index(bad)}` is {value}; expected 0 to {inp.id_max}"
                           + (f" (`cardinality` {inp.cardinality})" if inp.cardinality else ""))
    return ids.astype(inp.model_dtype, copy=False)


def _index(mask: np.ndarray) -> str:
    """``[3][1]``: where the first True of ``mask`` is."""
    flat = int(np.flatnonzero(mask)[0])
    return "".join(f"[{i}]" for i in np.unravel_index(flat, mask.shape))


# -- a model's declared inputs against the spec --------------------------------------------------


@dataclass(frozen=True, slots=True)
class Declared:
    """One input as a model declares it: a program's placeholder, a server's metadata. dtype
    and shape are None where the format does not say (TorchScript keeps neither), a dimension
    None where it varies."""

    name: str
    dtype: str | None = None
    shape: tuple[int | None, ...] | None = None


def check_model_args(declared: Sequence[Declared], signature: Signature, source: str) -> None:
    """Refuse a model whose declared inputs are not the spec's tensors: their count, then each
    one's dtype and fixed dimensions. SignatureMismatch names the config key and the input."""
    args = signature.args()
    if len(declared) != len(args):
        raise SignatureMismatch(
            f"{source} takes {len(declared)} inputs ({', '.join(d.name for d in declared)}); "
            f"its spec declares {len(args)} ({', '.join(a.name for a in args)}): declare the "
            "model's inputs in `model.inputs`, in the order forward takes them")
    for position, (got, want) in enumerate(zip(declared, args, strict=True)):
        where = f"{source} input {position} ({got.name}) against `{want.key}` ({want.field})"
        if got.dtype is not None and got.dtype != want.dtype.name:
            raise SignatureMismatch(f"{where}: the model takes {got.dtype}; the worker sends "
                                    f"{want.describe()}")
        if got.shape is None:
            continue
        if len(got.shape) != len(want.shape) or any(
                g is not None and w is not None and g != w
                for g, w in zip(got.shape, want.shape, strict=True)):
            shape = ", ".join("B" if d is None else str(d) for d in got.shape)
            raise SignatureMismatch(f"{where}: the model takes [{shape}]; the worker sends "
                                    f"{want.describe()}")
