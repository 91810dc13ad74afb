"""GGUF files served in their own block formats (weight formats ``gguf`` and ``gguf-q8``): tiny files of a wide tiny
llama (rows of whole 256-value super-blocks) in every type with a kernel (Q4_0 ... IQ4_XS, F16, BF16) and llama.cpp's
Q4_K_M mix keep their linear layers (the tied LM head too) in blocks and give the logits of the file's float32
dequantization; a type without a kernel runs dequantized, named in a warning; a prompt cut
in any chunks and a batch of runs give the logits of the prompt alone, bit for bit; without the native kernels the
torch path gives the same logits; tensors that disagree with the metadata are a typed error naming them."""

from __future__ import annotations

import pytest
import torch

from chat.engine.runtime import Feed
from chat.models import InvalidSettingError, ModelFileError, load_model
from chat.models.kernels import block_matrices, native
from chat.models.kernels.block_matrices import BlockMatrix, BlockQ8Matrix, BlockQ16Matrix, StackedMatrix
from tests.chat.models.gguf_helpers import dequantized_copy, reference_wide_llama, write_tiny_gguf
from tests.chat.models.helpers import TOLERANCE, full_logits, random_tokens

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "F16"]
TYPES += ["BF16", "Q4_K_M"]
needs_kernels = pytest.mark.skipif(block_matrices.kernels() is None, reason="no native block kernels on this machine")
Q8_TOLERANCE = 0.25  # gguf-q8 rounds activations to int8 per 32 values (measured: 0.069 from float32's logits)


@pytest.fixture(scope="module", autouse=True)
def home(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TURNCACHE_HOME", str(tmp_path_factory.mktemp("turncache-home")))
        yield


@pytest.fixture(scope="module")
def reference():
    torch.set_num_threads(1)
    return reference_wide_llama()


@pytest.fixture(scope="module")
def files(tmp_path_factory, reference):
    folder = tmp_path_factory.mktemp("gguf-blocks")
    return {q: write_tiny_gguf(folder / f"wide-{q.lower()}.gguf", reference, qtype=q) for q in TYPES}


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


def matrices(model):
    """Every matrix of the model's own decoder (chat.models.decoder.model): each layer's fused q/k/v, o, fused gate/up
    and down, and the LM head."""
    decoder = model._model
    found = [decoder.head]
    for block in decoder.layers:
        found += [block.qkv.matrix, block.o, block.gate_up.matrix, block.down]
    return found


@needs_kernels
@pytest.mark.parametrize("qtype", TYPES)
def test_a_block_format_file_keeps_its_blocks_and_gives_its_dequantized_logits(files, reference, qtype):
    model = load_model(str(files[qtype]))  # a GGUF file's default: gguf-q16
    assert model.weights == "gguf-q16" and model.dtype == "float16"  # every product exact per token: float16 K/V
    kinds = {type(m) for m in matrices(model)}
    assert kinds <= {BlockQ16Matrix, BlockMatrix, StackedMatrix} and BlockQ16Matrix in kinds  # F16: BlockQ16Matrix
    if qtype == "Q4_K_M":
        assert StackedMatrix in kinds  # q/k in Q4_K beside v in Q6_K
    assert isinstance(model._model.head, BlockMatrix)  # the tied head reads the embedding's blocks
    assert block_matrices.float32_layers(model._model) == 0
    tokens = random_tokens(model, 40, seed=1)
    expected = hf_logits(dequantized_copy(reference, qtype), tokens)
    exact = load_model(str(files[qtype]), weights="gguf", kv_dtype="float32")
    assert (full_logits(exact, tokens) - expected).abs().max().item() <= TOLERANCE
    # int16 activations and float16 K/V rows: measured at most 0.0021 (Q3_K's random blocks), gguf-q8 0.069
    assert (full_logits(model, tokens) - expected).abs().max().item() <= 50 * TOLERANCE


@needs_kernels
def test_gguf_q8_rounds_the_activations_only(files, reference):
    model = load_model(str(files["Q4_1"]), weights="gguf-q8", kv_dtype="float32")
    assert {type(m) for m in matrices(model)} == {BlockQ8Matrix}
    tokens = random_tokens(model, 40, seed=2)
    diff = (full_logits(model, tokens) - hf_logits(dequantized_copy(reference, "Q4_1"), tokens)).abs().max().item()
    assert TOLERANCE < diff <= Q8_TOLERANCE


@needs_kernels
@pytest.mark.parametrize("weights", ["gguf", "gguf-q8"])
def test_chunks_and_batches_give_the_prompt_alone_bit_for_bit(files, weights):
    model = load_model(str(files["Q4_K_M"]), weights=weights)
    ids = random_tokens(model, 60, seed=3)

    def logits(chunks):
        run, out, at = model.new_run(), [], 0
        for size in chunks:
            out.append(model.forward(run, ids[at : at + size]))
            at += size
        model.close_run(run)
        return torch.cat(out)

    whole = logits([60])
    assert torch.equal(logits([17, 1, 30, 12]), whole)
    assert torch.equal(logits([1] * 60), whole)
    runs = [model.new_run() for _ in range(3)]
    for run, n in zip(runs, (20, 7, 33), strict=True):  # three runs at different lengths, then one batched step
        model.forward(run, ids[:n])
    batched = model.forward_batch([Feed(run, [ids[n]], 1) for run, n in zip(runs, (20, 7, 33), strict=True)])
    for got, n in zip(batched, (20, 7, 33), strict=True):
        assert torch.equal(got[0], whole[n])


def test_the_torch_path_gives_the_same_logits(files, reference):
    with native.disabled():
        model = load_model(str(files["Q4_K"]), weights="gguf")
        assert model.dtype == "float32"  # without the kernels a product is not exact per token: float32 K/V
        assert all(m.packed is None for m in matrices(model) if isinstance(m, BlockMatrix))
        tokens = random_tokens(model, 30, seed=4)
        expected = hf_logits(dequantized_copy(reference, "Q4_K"), tokens)
        assert (full_logits(model, tokens) - expected).abs().max().item() <= TOLERANCE


def test_block_formats_need_a_gguf_file():
    with pytest.raises(InvalidSettingError, match="not a GGUF file") as info:
        load_model("tiny-llama", weights="gguf")
    assert info.value.field == "weights"


def test_tensors_that_disagree_with_the_metadata_are_named(reference, tmp_path):
    reference.config.intermediate_size = 384  # the metadata says 384, the tensors hold 512
    try:
        path = write_tiny_gguf(tmp_path / "wrong.gguf", reference, qtype="Q4_K")
    finally:
        reference.config.intermediate_size = 512
    with pytest.raises(ModelFileError, match=r"blk\.0\.ffn_(gate|up|down)\.weight has shape") as info:
        load_model(str(path))
    assert str(path) in str(info.value)


@needs_kernels
def test_a_type_without_a_kernel_runs_dequantized_and_is_named(tmp_path, reference, caplog):
    """TQ2_0 (ternary) has no block kernel: its layers load through gguf-py's dequantization, in float32, with a
    warning naming the type; the logits are still the file's."""
    path = write_tiny_gguf(tmp_path / "wide-tq2_0.gguf", reference, qtype="TQ2_0")
    with caplog.at_level("WARNING", logger="chat.models.decoder.gguf_weights"):
        model = load_model(str(path), weights="gguf", kv_dtype="float32")
    assert any("TQ2_0" in r.getMessage() and "no block kernel" in r.getMessage() for r in caplog.records)
    layers = 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the tied head
    assert block_matrices.float32_layers(model._model) == layers
    tokens = random_tokens(model, 30, seed=5)
    expected = hf_logits(dequantized_copy(reference, "TQ2_0"), tokens)
    assert (full_logits(model, tokens) - expected).abs().max().item() <= TOLERANCE


@needs_kernels
@pytest.mark.parametrize("weights", ["gguf-q16", "int8", "float32"])
def test_the_embedding_stays_in_the_files_blocks_unless_float32(files, reference, weights):
    """The lookups read the tied head's packed rows (block formats) or a copy of the file's blocks (int8): no float32
    table is kept, and the logits are those of the float32 table."""
    model = load_model(str(files["Q4_K"]), weights=weights)
    embed = model._model.embed
    if weights == "float32":
        assert isinstance(embed, torch.nn.Embedding)
        return
    assert isinstance(embed, block_matrices.BlockEmbedding)
    assert (embed.head is model._model.head) == (weights == "gguf-q16") and (embed.raw is None) == (
        embed.head is not None
    )
    assert not any(p.numel() > 1_000_000 for p in model._model.parameters())
    ids = torch.tensor([0, 5, 300, 5])
    table = dequantized_copy(reference, "Q4_K").model.embed_tokens.weight.detach()
    assert torch.equal(embed(ids), table[ids])
