"""chat.models.kernels.matrices: the weight formats' one table, every format in it exactly once, each entry built
the way its family builds (dense: from a float32 weight and bias; a GGUF file's blocks: from its linear modules)."""

from __future__ import annotations

import torch

from chat.models.kernels import block_matrices, dense_matrices
from chat.models.kernels.matrices import MATRICES, WEIGHT_FORMATS


def test_every_weight_format_has_one_matrix_and_nothing_else_does():
    assert len(set(WEIGHT_FORMATS)) == len(WEIGHT_FORMATS)
    assert set(MATRICES) == set(WEIGHT_FORMATS)
    assert set(block_matrices.BLOCK_FORMATS) <= set(WEIGHT_FORMATS)


def test_dense_formats_build_from_a_weight_and_block_formats_from_modules():
    weight, bias = torch.randn(16, 8), torch.randn(16)
    x = torch.randn(2, 8)
    for name in ("float32", "bfloat16", "int8"):
        matrix = MATRICES[name](weight, bias)
        assert type(matrix).__module__ == dense_matrices.__name__
        assert matrix(x).shape == (2, 16) and matrix(x).dtype == torch.float32
    for name in block_matrices.BLOCK_FORMATS:
        assert callable(MATRICES[name].from_layers)
