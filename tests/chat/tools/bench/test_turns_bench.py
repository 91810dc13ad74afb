"""`bench turns` on a multimodal model: media in every user message, repeats never re-encoded, the same keys as the
text benchmark plus ``encoder_skipped``."""

from __future__ import annotations

import torch

from chat.tools.bench import turns_bench


def test_media_turns_report_every_key_and_skip_the_encoder_for_repeats():
    torch.set_num_threads(1)
    out = turns_bench.run("tiny-omni", turns=5, reply_tokens=4, decode_tokens=3, repeats=1, session_turns=3)
    keys = ("ttft_hit_ms", "ttft_miss_ms", "ttft_floor_ms", "hf_reprefill_ms", "hit_speedup", "overhead_ratio",
            "decode_tps", "hf_decode_tps", "decode_ratio", "encoder_skipped")  # fmt: skip
    for key in keys:  # HF's decode rate subtracts two timings: with 3 tokens it may be noise, even negative
        assert isinstance(out[key], float), key
    assert all(out[key] > 0 for key in ("ttft_hit_ms", "ttft_miss_ms", "ttft_floor_ms", "hf_reprefill_ms"))
    # turn 5 repeats the image of turn 1 in a new message; every turn resends the earlier media
    assert out["media_items"] == 5 and out["media_repeated"] == 1 + 2 + 3 + (4 + 1)
    assert out["encoder_skipped"] == 1.0
    assert out["turn10_cached_tokens"] > 0
    # the session of one new photo per turn: one render time and one time to first token per turn
    assert out["session_turns"] == 3 and out["session_photo_kib"] > 100
    assert len(out["request_ms_per_turn"]) == len(out["render_ms_per_turn"]) == len(out["ttft_ms_per_turn"]) == 3
    assert all(0 < r < t for r, t in zip(out["render_ms_per_turn"], out["ttft_ms_per_turn"], strict=True))


def test_text_models_get_no_media_keys():
    torch.set_num_threads(1)
    out = turns_bench.run("tiny-llama", turns=3, reply_tokens=4, decode_tokens=3, repeats=1)
    assert "encoder_skipped" not in out and out["turn10_cached_tokens"] > 0


def test_an_int8_engine_is_compared_with_generate_on_the_float32_weights():
    torch.set_num_threads(1)
    out = turns_bench.run("tiny-llama", turns=3, reply_tokens=4, decode_tokens=3, repeats=1, weights="int8")
    assert out["weights"] == "int8" and isinstance(out["hf_decode_tps"], float) and out["hf_reprefill_ms"] > 0


def test_media_bytes_per_item_is_an_images_rows_and_deepstack_rows_as_held():
    """On Qwen3-VL an image's stored encoder output is its rows and one more set of rows per deepstack layer: the
    figure equals that size worked out here from the config and each image's token count, averaged over the images
    sent (turns 1-5: two pictures; the photo session: two photos); the video's is reported under its kind, and the
    images' encoder inputs, also held, apart."""
    from chat.models import load_model
    from chat.tools.bench.media_samples import moving_box_mp4, photo, picture

    torch.set_num_threads(1)
    out = turns_bench.run("tiny-qwen3vl", turns=5, reply_tokens=4, decode_tokens=3, repeats=1, session_turns=2)
    assert out["encoder_skipped"] == 1.0
    model = load_model("tiny-qwen3vl")
    config = model.full_model.config
    hidden = config.text_config.hidden_size
    deepstack = len(config.vision_config.deepstack_visual_indexes)
    assert deepstack > 0

    def stored(kind: str, data: bytes) -> tuple[int, int]:
        """(bytes of the encoder output held, bytes of the encoder inputs held) for one item."""
        prepared = model.family.preparers[kind].prepare(data, None, kind)
        span = len(prepared.layout) if prepared.layout else prepared.tokens
        inputs = sum(t.numel() * t.element_size() for t in prepared.inputs.values())
        return (1 + deepstack) * span * hidden * 4, inputs  # float32 rows

    images = [stored("image", data) for data in (picture(1), picture(2), photo(100), photo(101))]
    assert out["media_items_held"] == 5
    assert out["media_bytes_per_item"] == sum(size for size, _ in images) / 4
    assert out["media_prepared_bytes_per_item"] == sum(inputs for _, inputs in images) / 4
    video = stored("video", moving_box_mp4(1))[0]
    assert out["media_bytes_per_kind"] == {"image": out["media_bytes_per_item"], "video": video}


def test_the_ten_turn_chat_fits_tiny_mistral3():
    """tiny-mistral3's replies are lone bytes that come back into the history as U+FFFD, three tokens each: its ten
    turns outgrow 4,096 tokens, and its window holds them."""
    torch.set_num_threads(1)
    out = turns_bench.run("tiny-mistral3", turns=10, reply_tokens=128, decode_tokens=2, repeats=1, session_turns=1)
    assert out["turn10_prompt_tokens"] > 4096 and out["encoder_skipped"] == 1.0
