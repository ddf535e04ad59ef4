"""An MLServer custom runtime: a scikit-learn model over the two tensors a Surplus worker sends.

MLServer's scikit-learn runtime (mlserver-sklearn) decodes a request as one input tensor; a
ranking model takes two, the request's dense features (FP32[B, num_dense]) and each
candidate's sparse ids (INT64[B, num_sparse]), as Triton's DLRM and most ranking models do.
This runtime, loaded by MLServer from the model's folder (``implementation`` in
model-settings.json), joins the two columns-wise and calls the joblib-saved model's
``predict``: the protocol, HTTP server and codecs are MLServer's.

Runs inside MLServer's virtualenv (.venv-mlserver), not Surplus's.
"""

from __future__ import annotations

import joblib
import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class TwoTensorRanker(MLModel):
    """``predict`` of a scikit-learn model on [dense, sparse], one score per row."""

    async def load(self) -> bool:
        self._model = joblib.load(await get_model_uri(self._settings))
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        tensors = {t.name: NumpyCodec.decode_input(t) for t in payload.inputs}
        missing = {"dense", "sparse"} - set(tensors)
        if missing:
            raise InferenceError(f"missing input tensors: {sorted(missing)}")
        rows = np.hstack([tensors["dense"].astype(np.float64),
                          tensors["sparse"].astype(np.float64)])
        scores = self._model.predict(rows)
        return InferenceResponse(model_name=self.name, model_version=self.version,
                                 outputs=[NumpyCodec.encode_output("predict", scores)])
