"""The smallest reference-model config the runtime tests build (both model files use it)."""

from workers.runtime.models import ModelConfig

TINY = ModelConfig(num_dense=4, num_sparse=3, rows_per_table=50, embedding_dim=4,
                   bottom_mlp=(8,), top_mlp=(8,), deep_mlp=(32, 16), cross_layers=2, seed=7)
