"""Build an MLServer model repository: a scikit-learn linear ranker over the worker's features.

    .venv-mlserver/bin/python infra/mlserver/build_model.py OUT [--name ranker]
        [--num-dense 13] [--num-sparse 8] [--input-shape-sparse N] [--no-inputs]

Writes OUT/NAME/ (model.joblib, model-settings.json, the custom runtime, coefficients.json).
The model: dense features as they are and cos(id) of each sparse id (a fixed hash of the id
into [-1, 1]) into a ridge regression fitted on synthetic clicks. ``coefficients.json`` holds
its weights so a test in Surplus's own virtualenv (no scikit-learn there) can compute the
scores it expects. The metadata it declares (``inputs``) is what the worker checks at start;
``--input-shape-sparse`` and ``--no-inputs`` declare a wrong or no shape, for the tests of
that check. Runs in MLServer's virtualenv.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import joblib
import numpy as np
from sklearn.compose import ColumnTransformer
from sklearn.linear_model import Ridge
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer

HERE = Path(__file__).resolve().parent


def build(out: Path, name: str, num_dense: int, num_sparse: int, sparse_shape: int,
          declare_inputs: bool, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    rows = 2048
    dense = rng.standard_normal((rows, num_dense))
    sparse = rng.integers(0, 1 << 30, (rows, num_sparse)).astype(np.float64)
    truth = rng.standard_normal(num_dense + num_sparse) * 0.1
    clicks = (np.hstack([dense, np.cos(sparse)]) @ truth + rng.standard_normal(rows) * 0.05
              > 0).astype(np.float64)
    model = Pipeline([
        ("features", ColumnTransformer([
            ("dense", "passthrough", list(range(num_dense))),
            ("sparse", FunctionTransformer(np.cos),
             list(range(num_dense, num_dense + num_sparse)))])),
        ("ridge", Ridge(alpha=1.0))])
    model.fit(np.hstack([dense, sparse]), clicks)
    ridge = model.named_steps["ridge"]
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    joblib.dump(model, folder / "model.joblib")
    shutil.copy(HERE / "ranker_runtime.py", folder / "ranker_runtime.py")
    settings: dict[str, object] = {
        "name": name, "implementation": "ranker_runtime.TwoTensorRanker",
        "outputs": [{"name": "predict", "datatype": "FP64", "shape": [-1]}],
        "parameters": {"uri": "./model.joblib"}}
    if declare_inputs:
        settings["inputs"] = [
            {"name": "dense", "datatype": "FP32", "shape": [-1, num_dense]},
            {"name": "sparse", "datatype": "INT64", "shape": [-1, sparse_shape]}]
    (folder / "model-settings.json").write_text(json.dumps(settings, indent=2) + "\n")
    (folder / "coefficients.json").write_text(json.dumps({
        "dense": ridge.coef_[:num_dense].tolist(), "sparse_cos": ridge.coef_[num_dense:].tolist(),
        "intercept": float(ridge.intercept_)}) + "\n")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--name", default="ranker")
    parser.add_argument("--num-dense", type=int, default=13)
    parser.add_argument("--num-sparse", type=int, default=8)
    parser.add_argument("--input-shape-sparse", type=int, default=None)
    parser.add_argument("--no-inputs", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    folder = build(args.out, args.name, args.num_dense, args.num_sparse,
                   args.input_shape_sparse or args.num_sparse, not args.no_inputs, args.seed)
    print(folder)


if __name__ == "__main__":
    main()
