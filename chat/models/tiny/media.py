"""Tiny seeded multimodal models for tests: ``tiny-omni`` (a Qwen2.5-Omni thinker: text + image + audio + video with
3-D mRoPE), ``tiny-llava`` (LLaVA: a CLIP vision tower on a Llama, images, 1-D RoPE) and ``tiny-smolvlm`` (SmolVLM:
images split into 32-px tiles plus a global image, a pixel-shuffle connector, a Llama), and the others named in
:data:`TINY_MM` (``tiny-qwen3vl`` / ``tiny-qwen3vlmoe``: Qwen3-VL with deepstack features, images and timestamped
videos).

They use the committed tiny tokenizer with the family's placeholder tokens added (always in the same order, so their
ids are fixed) and a ChatML template that renders content parts the way the real models' templates do. Weights come
from a fixed seed, drawn like :func:`chat.models.tiny.text.build_tiny_model`'s. Processors are the real transformers
classes with small pixel budgets so that an image is a few dozen tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from chat.models.tiny.text import _COMMON, INIT_STD, SEED

OMNI_TOKENS = [
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
]
LLAVA_TOKENS = ["<image>"]
OMNI_PARTS = {
    "image": "<|vision_bos|><|IMAGE|><|vision_eos|>",
    "video": "<|vision_bos|><|VIDEO|><|vision_eos|>",
    "audio": "<|audio_bos|><|AUDIO|><|audio_eos|>",
}
LLAVA_PARTS = {"image": "<image>\n"}
SMOLVLM_TILES = 4  # rows and columns of tiles the tokenizer has markers for (<row_R_col_C>)
SMOLVLM_TOKENS = [
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    *(f"<row_{r}_col_{c}>" for r in range(1, SMOLVLM_TILES + 1) for c in range(1, SMOLVLM_TILES + 1)),
]
SMOLVLM_PARTS = {"image": "<image>"}
SMOLVLM_TILE = 32  # px of a tile (the tower's input): 4x4 patches of 8 px, 4 tokens after the 2x pixel shuffle
SMOLVLM_LONGEST = 64  # px of an image's longest edge before splitting: at most 2x2 tiles
IMAGE_MAX_PIXELS = 112 * 112  # at most 8x8 patches of 14 px: 16 tokens per image
VIDEO_MAX_PIXELS = 56 * 56  # per frame: 4 tokens per pair of frames
VIDEO_FRAMES = 8
LLAVA_IMAGE_SIZE = 56  # 4x4 patches of 14 px: 16 tokens per image

QWEN35_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

MISTRAL3_TOKENS = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]
MISTRAL3_PARTS = {"image": "[IMG]"}
MISTRAL3_PATCH = 8  # px of the tower's patch; merged 2x2, one prompt token per 16 px square
MISTRAL3_LONGEST = 64  # px of an image's longest edge: at most 4x4 prompt tokens
MISTRAL3_CONTEXT = 16384  # its language model's window (the real ones take 128k): its seeded weights answer with lone
# bytes, each written back into the history as U+FFFD (three byte tokens), so `bench turns`' ten turns need ~4.6k

GEMMA3_TOKENS = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
GEMMA3_PARTS = {"image": "<start_of_image>"}
GEMMA3_IMAGE = 32  # px of the tower's square input: 4x4 patches of 8 px, pooled to 2x2 = 4 image tokens

QWEN3VL_PARTS = {
    "image": "<|vision_start|><|image_pad|><|vision_end|>",
    "video": "<|vision_start|><|video_pad|><|vision_end|>",
}  # the tokens are QWEN35_TOKENS (tiny-qwen35vl, tiny-qwen3vl, tiny-qwen3vlmoe)
QWEN3VL_PATCH = 8  # px of the tower's patch; merged 2x2, one prompt token per 16 px square
QWEN3VL_VIDEO_PIXELS = 32 * 32 * 16  # a clip's pixel budget over all its frames: 16 frames of 32x32 px at most

TINY_MM = ("omni", "llava", "smolvlm", "qwen35vl", "mistral3", "gemma3mm", "qwen3vl", "qwen3vlmoe")


def chat_template(parts: dict[str, str]) -> str:
    """ChatML whose content may be a string or a list of parts (text, and the media kinds in ``parts``)."""
    media = "".join(f"{{% elif part['type'] == '{kind}' %}}{{{{ '{text}' }}}}" for kind, text in parts.items()).replace(
        "\n", "\\n"
    )
    return (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' }}"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] %}"
        "{% if part['type'] == 'text' %}{{ part['text'] }}" + media + "{% endif %}"
        "{% endfor %}{% endif %}"
        "{{ '<|im_end|>\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )


def tiny_tokenizer(extra: list[str], parts: dict[str, str]) -> Any:
    from transformers import AutoTokenizer

    from chat.models.tiny.tokenizer import ASSET_DIR

    tokenizer = AutoTokenizer.from_pretrained(str(ASSET_DIR), local_files_only=True)
    tokenizer.add_special_tokens({"additional_special_tokens": extra})
    tokenizer.chat_template = chat_template(parts)
    return tokenizer


def _seeded(model: Any, dtype: torch.dtype) -> Any:
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) * INIT_STD)
    return model.to(dtype).eval()


def omni_config(tokenizer: Any) -> Any:
    from transformers import Qwen2_5OmniThinkerConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in OMNI_TOKENS}
    return Qwen2_5OmniThinkerConfig(
        audio_config={
            "num_mel_bins": 16,
            "encoder_layers": 2,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "d_model": 32,
            "output_dim": 64,
            "n_window": 50,
        },
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "fullatt_block_indexes": [1],
            "window_size": 56,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        text_config={
            **_COMMON,
            "vocab_size": len(tokenizer),
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
        },
        audio_token_index=ids["<|AUDIO|>"],
        image_token_index=ids["<|IMAGE|>"],
        video_token_index=ids["<|VIDEO|>"],
        audio_start_token_id=ids["<|audio_bos|>"],
        audio_end_token_id=ids["<|audio_eos|>"],
        vision_start_token_id=ids["<|vision_bos|>"],
        vision_end_token_id=ids["<|vision_eos|>"],
    )


def llava_config(tokenizer: Any) -> Any:
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    tokens = (LLAVA_IMAGE_SIZE // 14) ** 2
    return LlavaConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=LLAVA_IMAGE_SIZE,
            patch_size=14,
            projection_dim=32,
        ),
        text_config=LlamaConfig(
            **_COMMON,
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        ),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        image_seq_length=tokens,
    )


def smolvlm_config(tokenizer: Any) -> Any:
    from transformers import LlamaConfig, SmolVLMConfig

    return SmolVLMConfig(
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": SMOLVLM_TILE,
            "patch_size": 8,
        },
        text_config=LlamaConfig(
            **_COMMON,
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        ),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        scale_factor=2,
        pad_token_id=tokenizer.pad_token_id,
    )


def qwen35vl_config(tokenizer: Any) -> Any:
    """Qwen3.5 with its vision tower: gated delta-net (recurrent) and full attention layers, interleaved mRoPE."""
    from transformers import Qwen3_5Config

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN35_TOKENS}
    return Qwen3_5Config(
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 64,
        },
        text_config={
            **_COMMON,
            "vocab_size": len(tokenizer),
            "head_dim": 16,
            "layer_types": ["linear_attention", "full_attention"] * 2,
            "linear_num_value_heads": 4,
            "linear_num_key_heads": 2,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 3, 3],
                "mrope_interleaved": True,
                "partial_rotary_factor": 1.0,
            },
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )


def qwen3vl_config(tokenizer: Any, moe: bool = False) -> Any:
    """Qwen3-VL (or Qwen3-VL-MoE) with a two-block tower whose both blocks give deepstack features (to the first two
    of four decoder layers), interleaved mRoPE."""
    from transformers import Qwen3VLConfig, Qwen3VLMoeConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN35_TOKENS}
    text = {
        **_COMMON,
        "vocab_size": len(tokenizer),
        "head_dim": 16,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 3, 3],
            "mrope_interleaved": True,
        },
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    if moe:
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, decoder_sparse_step=1)
    return (Qwen3VLMoeConfig if moe else Qwen3VLConfig)(
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "patch_size": QWEN3VL_PATCH,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0, 1],
        },
        text_config=text,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )


def mistral3_config(tokenizer: Any) -> Any:
    from transformers import Mistral3Config, MistralConfig, PixtralVisionConfig

    return Mistral3Config(
        vision_config=PixtralVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            head_dim=16,
            image_size=MISTRAL3_LONGEST,
            patch_size=MISTRAL3_PATCH,
        ),
        text_config=MistralConfig(
            **{**_COMMON, "max_position_embeddings": MISTRAL3_CONTEXT},
            vocab_size=len(tokenizer),
            sliding_window=None,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        ),
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=2,
        vision_feature_layer=-1,
    )


def gemma3mm_config(tokenizer: Any) -> Any:
    """Gemma 3 with its vision tower: sliding-window and full-attention layers; image tokens attend both ways."""
    from transformers import Gemma3Config, Gemma3TextConfig, SiglipVisionConfig

    from chat.models.tiny.text import WINDOW

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in GEMMA3_TOKENS}
    return Gemma3Config(
        text_config=Gemma3TextConfig(
            **_COMMON,
            vocab_size=len(tokenizer),
            sliding_window=WINDOW,
            head_dim=16,
            layer_types=["sliding_attention", "full_attention"] * 2,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        ),
        vision_config=SiglipVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=GEMMA3_IMAGE,
            patch_size=8,
        ),
        mm_tokens_per_image=4,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
    )


def tiny_multimodal_text(name: str) -> tuple[Any, Any]:
    """``(tokenizer, config)`` of ``tiny-<name>`` (``name`` in :data:`TINY_MM`): everything but its weights."""
    if name == "omni":
        tokenizer = tiny_tokenizer(OMNI_TOKENS, OMNI_PARTS)
        return tokenizer, omni_config(tokenizer)
    if name == "llava":
        tokenizer = tiny_tokenizer(LLAVA_TOKENS, LLAVA_PARTS)
        return tokenizer, llava_config(tokenizer)
    if name == "smolvlm":
        tokenizer = tiny_tokenizer(SMOLVLM_TOKENS, SMOLVLM_PARTS)
        return tokenizer, smolvlm_config(tokenizer)
    if name == "qwen35vl":
        tokenizer = tiny_tokenizer(QWEN35_TOKENS, QWEN3VL_PARTS)
        return tokenizer, qwen35vl_config(tokenizer)
    if name == "mistral3":
        tokenizer = tiny_tokenizer(MISTRAL3_TOKENS, MISTRAL3_PARTS)
        return tokenizer, mistral3_config(tokenizer)
    if name == "gemma3mm":
        tokenizer = tiny_tokenizer(GEMMA3_TOKENS, GEMMA3_PARTS)
        return tokenizer, gemma3mm_config(tokenizer)
    if name in ("qwen3vl", "qwen3vlmoe"):
        tokenizer = tiny_tokenizer(QWEN35_TOKENS, QWEN3VL_PARTS)
        return tokenizer, qwen3vl_config(tokenizer, moe=name == "qwen3vlmoe")
    raise KeyError(name)


def tiny_family(name: str, config: Any, tokenizer: Any = None) -> Any:
    """How ``tiny-<name>`` takes media (a ``chat.models.hf.families_mm.MultimodalFamily``): its processors, no weights
    (``tokenizer``: tiny-smolvlm's, whose markers its images are written with; made anew if None)."""
    from chat.models.hf.families_mm import (
        gemma3_family,
        llava_family,
        pixtral_family,
        qwen3_family,
        qwen_family,
        tiled_family,
    )

    if name == "omni":
        from transformers import WhisperFeatureExtractor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        return qwen_family(
            config,
            image_processor=Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=IMAGE_MAX_PIXELS),
            video_processor=Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=VIDEO_MAX_PIXELS),
            video_frames=VIDEO_FRAMES,
            audio_extractor=WhisperFeatureExtractor(feature_size=16),
        )
    if name == "llava":
        from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

        processor = LlavaImageProcessorPil(
            size={"shortest_edge": LLAVA_IMAGE_SIZE},
            crop_size={"height": LLAVA_IMAGE_SIZE, "width": LLAVA_IMAGE_SIZE},
        )
        return llava_family(config, processor)
    if name == "smolvlm":
        from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

        processor = SmolVLMImageProcessorPil(
            size={"longest_edge": SMOLVLM_LONGEST}, max_image_size={"longest_edge": SMOLVLM_TILE}
        )
        tokenizer = tokenizer if tokenizer is not None else tiny_tokenizer(SMOLVLM_TOKENS, SMOLVLM_PARTS)
        return tiled_family(config, processor, tokenizer)
    if name == "qwen35vl":  # its processor is Qwen3-VL's: videos as frame groups with timestamps
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        tokenizer = tokenizer if tokenizer is not None else tiny_tokenizer(QWEN35_TOKENS, QWEN3VL_PARTS)
        return qwen3_family(
            config,
            tokenizer,
            image_processor=Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=IMAGE_MAX_PIXELS),
            video_processor=Qwen2VLImageProcessorPil(min_pixels=28 * 28 * 2, max_pixels=28 * 28 * 32),
            video_frames=VIDEO_FRAMES,
        )
    if name == "mistral3":
        from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

        merged = MISTRAL3_PATCH * 2
        processor = PixtralImageProcessorPil(
            size={"longest_edge": MISTRAL3_LONGEST}, patch_size={"height": merged, "width": merged}
        )
        tokenizer = tokenizer if tokenizer is not None else tiny_tokenizer(MISTRAL3_TOKENS, MISTRAL3_PARTS)
        return pixtral_family(config, processor, tokenizer)
    if name == "gemma3mm":
        from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

        processor = Gemma3ImageProcessorPil(size={"height": GEMMA3_IMAGE, "width": GEMMA3_IMAGE}, do_pan_and_scan=False)
        tokenizer = tokenizer if tokenizer is not None else tiny_tokenizer(GEMMA3_TOKENS, GEMMA3_PARTS)
        return gemma3_family(config, processor, tokenizer)
    if name in ("qwen3vl", "qwen3vlmoe"):
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        half = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "patch_size": QWEN3VL_PATCH}
        image = Qwen2VLImageProcessorPil(min_pixels=16 * 16, max_pixels=IMAGE_MAX_PIXELS, **half)
        video = Qwen2VLImageProcessorPil(min_pixels=16 * 16 * 2, max_pixels=QWEN3VL_VIDEO_PIXELS, **half)
        tokenizer = tokenizer if tokenizer is not None else tiny_tokenizer(QWEN35_TOKENS, QWEN3VL_PARTS)
        return qwen3_family(config, tokenizer, image_processor=image, video_processor=video, video_frames=VIDEO_FRAMES)
    raise KeyError(name)


def build_tiny_multimodal(name: str, dtype: torch.dtype) -> tuple[Any, Any, Any]:
    """``(model, tokenizer, family)`` of ``tiny-<name>`` (``name`` in :data:`TINY_MM`)."""
    import transformers

    tokenizer, config = tiny_multimodal_text(name)
    model_class = getattr(transformers, MODEL_CLASSES[name])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = _seeded(model_class(config), dtype)
    return model, tokenizer, tiny_family(name, model.config, tokenizer)


MODEL_CLASSES = {  # tiny name -> its transformers class
    "omni": "Qwen2_5OmniThinkerForConditionalGeneration",
    "llava": "LlavaForConditionalGeneration",
    "smolvlm": "SmolVLMForConditionalGeneration",
    "qwen35vl": "Qwen3_5ForConditionalGeneration",
    "mistral3": "Mistral3ForConditionalGeneration",
    "gemma3mm": "Gemma3ForConditionalGeneration",
    "qwen3vl": "Qwen3VLForConditionalGeneration",
    "qwen3vlmoe": "Qwen3VLMoeForConditionalGeneration",
}
