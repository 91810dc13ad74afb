"""The weight formats' table (:data:`WEIGHT_FORMATS`, :data:`MATRICES`): one matrix class per format, what every linear
layer of a model is computed through. The dense formats live in :mod:`chat.models.kernels.dense_matrices`, a GGUF file's
blocks in :mod:`chat.models.kernels.block_matrices`; this module imports both and neither imports it.

The interface (the seam between a forward and a weight format): a matrix ``m`` of ``[out, in]`` weights

    m(x)            ``x`` ``[..., in]`` float32 -> ``[..., out]`` float32
    m.rows(lo, hi)  output channels ``[lo, hi)`` as a matrix of their own (sharing memory where the format allows)
    m.fuse_rows     most input rows for which a fused matrix (q/k/v, gate/up) is faster called whole than by parts

Formats (:data:`WEIGHT_FORMATS`, :data:`MATRICES`):

- ``float32`` (:class:`Float32Matrix`): the weight as loaded; 1 row and 2-:data:`FEW_ROWS` rows run the faster of two
  BLAS forms for their weight shape, chosen once per shape by timing both (:func:`calibrate`, :class:`BlasForms`):
  one row by ``F.linear`` (a GEMV) or as a two-row ``torch.mm`` (a GEMM, faster with 2 threads here), a few rows by
  ``F.linear`` or ``torch.mm(weight, x.T)``; more rows always by ``F.linear``.
- ``bfloat16`` (:class:`BFloat16Matrix`): bf16 weights; activations are rounded to bf16 for the product, the result
  goes back to float32.
- ``int8`` (:class:`Int8Matrix`): int8 weights with one float32 scale per output channel (symmetric), activations
  quantized per token (symmetric, their own absolute maximum -> 127) just before each product, computed with int32
  accumulation by turncache's native kernel (:mod:`chat.models.kernels.native`, which keeps only its packed copy of the
  weight) or, without it, by ``torch._int_mm``: the same numbers either way. A token's result depends only on that
  token, never on the rest of the batch, so a batched forward gives what a forward alone gives.

- ``gguf``, ``gguf-q8``, ``gguf-q16`` (:mod:`chat.models.kernels.block_matrices`): a GGUF file's own blocks, weight-only
  or with int8 / int16 activations; built from the checkpoint's linear modules (``from_layers``), which hold the blocks.

Any object with this interface can stand for a weight format.
"""

from __future__ import annotations

from typing import Any

from chat.models.kernels import block_matrices
from chat.models.kernels.dense_matrices import BFloat16Matrix, Float32Matrix, Int8Matrix

WEIGHT_FORMATS = ("float32", "bfloat16", "int8", *block_matrices.BLOCK_FORMATS)

MATRICES: dict[str, Any] = {"float32": Float32Matrix, "bfloat16": BFloat16Matrix, "int8": Int8Matrix}  # format ->
# class built from a float32 weight and bias: make(weight, bias)
MATRICES.update(block_matrices.MATRICES)  # a GGUF file's blocks: objects with from_layers(modules)
