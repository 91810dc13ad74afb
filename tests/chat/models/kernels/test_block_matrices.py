"""The block-format matrices (chat.models.kernels.block_matrices): every kernel type unpacks to gguf-py's own
dequantization bit for bit; the three designs compute the product with those weights (weight-only: float32 rounding
only; gguf-q8 / gguf-q16: the activations on their int8 / int16 block grid, as the torch path rounds them too); a row's
result in a batch is its result alone, bit for bit; a part of a fused matrix computes its own columns; without the
native kernels the torch path gives the same function."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from chat.models.kernels import block_matrices, native
from chat.models.kernels.block_matrices import (
    BlockMatrix,
    BlockQ8Matrix,
    BlockQ16Matrix,
    BlockWeight,
    StackedMatrix,
    unpack,
)

needs_kernels = pytest.mark.skipif(block_matrices.kernels() is None, reason="no native block kernels on this machine")
DESIGNS = [BlockMatrix, BlockQ8Matrix, BlockQ16Matrix]
SCALES = {  # (byte offset of a float16 field in a block, its range): sane scales for random blocks
    "Q4_0": [(0, -0.02, 0.02)],
    "Q4_1": [(0, 0.0, 0.02), (2, -0.1, 0.1)],
    "Q8_0": [(0, -0.002, 0.002)],
    "Q4_K": [(0, 0.0, 0.002), (2, 0.0, 0.002)],
    "Q6_K": [(208, -0.002, 0.002)],
    "Q5_0": [(0, -0.02, 0.02)],
    "Q5_1": [(0, 0.0, 0.02), (2, -0.1, 0.1)],
    "Q5_K": [(0, 0.0, 0.002), (2, 0.0, 0.002)],
    "Q3_K": [(108, -0.002, 0.002)],
    "Q2_K": [(80, 0.0, 0.002), (82, 0.0, 0.002)],
    "IQ4_NL": [(0, -0.002, 0.002)],
    "IQ4_XS": [(0, -0.002, 0.002)],
}


def random_weight(qtype: str, n: int, k: int, seed: int = 0) -> BlockWeight:
    """Random blocks of ``qtype`` (every bit pattern of the quants is valid) with finite float16 scales."""
    rng = np.random.default_rng(seed)
    if qtype in block_matrices.HALF_TYPES:  # finite values of either 16-bit float
        values = rng.normal(0.0, 0.05, size=(n, k)).astype(np.float32)
        values[0, :4] = [0.0, -0.0, 1e-7, -6e4]  # zeros, a float16 subnormal, a large value
        raw = gguf.quants.quantize(values, gguf.GGMLQuantizationType[qtype]).view(np.uint8).reshape(n, -1)
        return BlockWeight(qtype, (n, k), raw)
    per, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    raw = rng.integers(0, 256, size=(n, k // per, size), dtype=np.uint8)
    for at, lo, hi in SCALES[qtype]:
        raw[..., at : at + 2] = rng.uniform(lo, hi, size=(n, k // per, 1)).astype(np.float16).view(np.uint8)
    return BlockWeight(qtype, (n, k), raw.reshape(n, -1))


def reference(weight: BlockWeight) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(weight.raw, gguf.GGMLQuantizationType[weight.qtype]))


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("qtype", block_matrices.KERNEL_TYPES)
def test_unpacked_weights_are_gguf_pys_dequantization_bit_for_bit(qtype):
    weight = random_weight(qtype, 37, 512)
    assert torch.equal(block_matrices.dequantize(unpack(weight)), reference(weight))


@needs_kernels
@pytest.mark.parametrize("qtype", block_matrices.KERNEL_TYPES)
@pytest.mark.parametrize("design", DESIGNS)
@pytest.mark.parametrize("bias", [False, True])
def test_the_kernels_compute_the_product_with_the_files_weights(qtype, design, bias):
    n, k = 70, 768  # channels not a multiple of 16: a padded last block
    weight = random_weight(qtype, n, k, seed=1)
    b = torch.randn(n) if bias else None
    x = torch.randn(11, k)
    matrix = design(unpack(weight), b)
    got = matrix(x)
    with native.disabled():  # the torch path: the same weights, the same activation rounding (gguf-q8)
        torch_path = design(unpack(weight), b)(x)
    if qtype in block_matrices.HALF_TYPES:  # 16-bit floats: weight-only in every format, kept in 16 bits
        assert matrix.levels == 0 and matrix.packed.nbytes == 2 * n * k + 2 * 10 * k  # 70 channels padded to 80
    inputs = block_matrices.quantize_activations(x, matrix.levels) if matrix.levels else x
    exact = F.linear(inputs.double(), reference(weight).double(), None if b is None else b.double())
    scale = exact.abs().max().item()
    assert (got.double() - exact).abs().max().item() <= 1e-5 * scale
    assert (torch_path.double() - exact).abs().max().item() <= 1e-5 * scale


@needs_kernels
@pytest.mark.parametrize("qtype", ["Q4_1", "Q6_K", "Q8_0", "Q3_K", "Q2_K", "F16", "BF16"])
@pytest.mark.parametrize("design", DESIGNS)
def test_a_row_in_any_batch_is_the_row_alone_bit_for_bit(qtype, design):
    weight = random_weight(qtype, 48, 512, seed=2)
    matrix = design(unpack(weight), torch.randn(48))
    x = torch.randn(19, 512)  # 19 rows: full passes of 4 and 8 rows and a remainder
    whole = matrix(x)
    for size in (1, 3, 5, 8, 13):
        parts = torch.cat([matrix(x[i : i + size]) for i in range(0, 19, size)])
        assert torch.equal(parts, whole), size


def random_unpacked(bits: int, sub: int, n: int, k: int, seed: int) -> block_matrices.Unpacked:
    """A random weight in the common form with any quant width and sub-block (4 bits in sub-blocks of 16: a layout
    the kernels take although no file type has it yet), stored offsets."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 1 << bits, size=(n, k), dtype=np.uint8)
    scale = rng.uniform(0.0, 0.02, size=(n, k // sub)).astype(np.float16).astype(np.float32)
    offset = rng.uniform(-0.1, 0.1, size=(n, k // sub)).astype(np.float16).astype(np.float32)
    return block_matrices.Unpacked(u, scale, offset, bits=bits, sub=sub, bias=0.0)


@needs_kernels
@pytest.mark.parametrize("layout", [(4, 32), (4, 16), (8, 32), (8, 16)])
@pytest.mark.parametrize("design", DESIGNS)
def test_every_number_of_rows_computes_the_product_and_each_row_as_alone(layout, design):
    """Each kernel instance (1 to 8 rows a pass, per quant width and sub-block) against the exact product, and each
    row of every batch size equal to the row alone."""
    weight = random_unpacked(*layout, n=40, k=320, seed=9)
    matrix = design(weight, torch.randn(40))
    x = torch.randn(9, 320)
    inputs = block_matrices.quantize_activations(x, design.levels) if design.levels else x
    exact = F.linear(inputs.double(), block_matrices.dequantize(weight).double(), matrix.bias.double())
    alone = torch.cat([matrix(x[i : i + 1]) for i in range(9)])
    assert (alone.double() - exact).abs().max().item() <= 1e-5 * exact.abs().max().item()
    for rows in range(2, 10):
        assert torch.equal(matrix(x[:rows]), alone[:rows]), rows


@needs_kernels
@pytest.mark.parametrize("design", DESIGNS)
@pytest.mark.parametrize("bounds", [(0, 32), (32, 48), (5, 21), (40, 48)])
def test_a_part_computes_its_own_columns(design, bounds):
    weight = random_weight("Q4_K", 48, 256, seed=3)
    matrix = design(unpack(weight), torch.randn(48))
    x = torch.randn(3, 2, 256)  # leading dimensions are kept
    whole = matrix(x)
    assert whole.shape == (3, 2, 48)
    assert torch.equal(matrix.rows(*bounds)(x), whole[..., bounds[0] : bounds[1]])


def test_without_the_kernels_the_dequantized_weights_are_used():
    weight = random_weight("Q4_0", 20, 64, seed=4)
    with native.disabled():
        matrix = BlockMatrix(unpack(weight), None)
        assert matrix.packed is None and matrix.kernels is None
        x = torch.randn(5, 64)
        assert torch.equal(matrix(x), F.linear(x, reference(weight)))


def test_layers_of_different_layouts_are_stacked_and_others_stay_float32():
    q, v = random_weight("Q4_K", 32, 256, seed=5), random_weight("Q6_K", 16, 256, seed=6)
    layers = [torch.nn.Linear(256, 32, bias=False), torch.nn.Linear(256, 16, bias=False)]
    layers[0].block_weight, layers[1].block_weight = q, v
    matrix = block_matrices.MATRICES["gguf"].from_layers(layers)
    assert isinstance(matrix, StackedMatrix) and matrix.bounds == [(0, 32), (32, 48)]
    x = torch.randn(4, 256)
    expected = F.linear(x.double(), torch.cat([reference(q), reference(v)]).double())
    assert (matrix(x).double() - expected).abs().max().item() <= 1e-5 * expected.abs().max().item()
    assert torch.equal(matrix.rows(32, 48)(x), matrix(x)[:, 32:])
    plain = torch.nn.Linear(256, 8)  # no blocks (a type without a kernel, dequantized by the loader)
    single = block_matrices.MATRICES["gguf"].from_layers([plain])
    assert torch.allclose(single(x), plain(x), atol=1e-5)


def test_the_common_layout_of_a_fused_group_keeps_each_parts_weights():
    a, b = random_weight("Q4_0", 16, 64, seed=7), random_weight("Q4_1", 16, 64, seed=8)  # implied and stored offsets
    merged = block_matrices.concat([unpack(a), unpack(b)])
    assert merged is not None and merged.offset is not None
    assert torch.equal(block_matrices.dequantize(merged), torch.cat([reference(a), reference(b)]))
    assert block_matrices.concat([unpack(a), unpack(random_weight("Q8_0", 16, 64))]) is None  # 4 vs 8 bits


def test_raw_bytes_that_do_not_fit_the_shape_are_refused():
    weight = random_weight("Q4_1", 4, 64)
    with pytest.raises(ValueError, match="raw bytes"):
        unpack(BlockWeight("Q4_1", (4, 96), weight.raw))
    with pytest.raises(ValueError, match="no block kernel"):
        unpack(BlockWeight("TQ2_0", (4, 256), weight.raw))


PACKED_BITS = {  # bits a weight in the kernels' layout (the module docstring's table)
    **{"Q4_0": 5, "Q4_1": 6, "Q5_0": 9, "Q5_1": 10, "Q8_0": 9, "Q2_K": 8, "Q3_K": 6, "Q4_K": 6, "Q5_K": 10},
    **{"Q6_K": 10, "IQ4_NL": 9, "IQ4_XS": 9, "F16": 16, "BF16": 16},
}


@needs_kernels
@pytest.mark.parametrize("qtype", block_matrices.KERNEL_TYPES)
def test_each_type_costs_the_bits_a_weight_the_docstring_says(qtype):
    n, k = 32, 512
    matrix = BlockMatrix(unpack(random_weight(qtype, n, k, seed=10)), None)
    assert matrix.weight_bytes() * 8 == PACKED_BITS[qtype] * n * k


@needs_kernels
@pytest.mark.parametrize("qtype", block_matrices.KERNEL_TYPES)
def test_rows_read_back_from_the_packed_layout_are_the_files_values(qtype):
    weight = random_weight(qtype, 40, 512, seed=11)  # 40 channels: a padded last block
    matrix = BlockQ16Matrix(unpack(weight), None)
    rows = np.array([0, 39, 17, 16, 17, 5])
    assert torch.equal(torch.from_numpy(matrix.dequantize_rows(rows)), reference(weight)[rows])


@pytest.mark.parametrize("source", ["file", "head"])
def test_an_embedding_in_blocks_looks_up_the_files_rows(source):
    weight = random_weight("Q8_0", 48, 64, seed=12)
    if source == "head" and block_matrices.kernels() is None:
        pytest.skip("no native block kernels on this machine")
    embed = block_matrices.BlockEmbedding(weight if source == "file" else BlockMatrix(unpack(weight), None))
    ids = torch.tensor([[3, 47, 3], [0, 16, 31]])
    got = embed(ids)
    assert got.shape == (2, 3, 64) and got.dtype == torch.float32
    assert torch.equal(got, F.embedding(ids, reference(weight)))
    assert (embed.raw is None) == (source == "head")  # the head's rows: no copy of its own
