"""chat.models.hf.mrope: the same positions as transformers' ``get_rope_index``, and the same positions however the
sequence is split.

transformers' methods run on minimal stand-in objects (the method plus a config), so no model is built. Sequences are
random text with media items wrapped in their begin/end marker tokens the way the Qwen templates render them.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import Qwen2_5_VLConfig, Qwen2VLConfig
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniConfig, Qwen2_5OmniThinkerConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniPreTrainedModelForConditionalGeneration as OmniModel,
)
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

from chat.models.hf.mrope import MediaGrid, MropeSpec, mrope_positions

VS, VE, IMG, VID, AUD, AS, AE = 1, 2, 3, 4, 5, 6, 7  # vision bos/eos, placeholders, audio bos/eos
TEXT = tuple(range(10, 20))
EXACT_SPG = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0)  # seconds per grid whose products are exact in float32
SPG = (*EXACT_SPG, 0.083, 0.2, 1 / 3, 2 / 30, 0.7)
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Item:
    kind: str  # "image" | "video" | "audio" | "aiv" (Omni video with its audio interleaved)
    grid: tuple[int, int, int] | None = None
    spg: float | None = None
    audio: int | None = None  # audio tokens (audio item, or the audio of an "aiv")


@dataclass(frozen=True)
class Built:
    tokens: list[int]
    types: list[int]  # transformers' mm_token_type_ids: 0 text, 1 image, 2 video
    grids: list[MediaGrid]
    items: list[Item]


# ==================================================================================================== sequences


def build(layout: list[tuple[int, Item]], tail: int, m: int) -> Built:
    """Tokens of ``layout`` = [(text tokens before, item)] + ``tail`` text tokens, and each item's MediaGrid."""
    tokens: list[int] = []
    types: list[int] = []
    grids: list[MediaGrid] = []

    def add(ids: list[int], kind: int = 0) -> None:
        tokens.extend(ids)
        types.extend([kind] * len(ids))

    def text(n: int) -> None:
        add([TEXT[(len(tokens) + i) % len(TEXT)] for i in range(n)])

    for before, item in layout:
        text(before)
        if item.kind == "audio":
            add([AS])
            grids.append(MediaGrid("audio", len(tokens), item.audio))
            add([AUD] * item.audio)
            add([AE])
            continue
        t, h, w = item.grid
        n = t * (h // m) * (w // m)
        if item.kind == "aiv":
            start = len(tokens)
            add([VS, AS])
            add([VID] * n)
            add([AUD] * item.audio)
            add([AE, VE])
            grids.append(MediaGrid("video", start, len(tokens) - start, item.grid, item.spg, audio_length=item.audio))
            continue
        add([VS])
        grids.append(MediaGrid(item.kind, len(tokens), n, item.grid, item.spg if item.kind == "video" else None))
        add([IMG if item.kind == "image" else VID] * n, 1 if item.kind == "image" else 2)
        add([VE])
    text(tail)
    return Built(tokens, types, grids, [item for _, item in layout])


@st.composite
def items(draw, m: int, kinds: tuple[str, ...], spgs=SPG, image_t=(1, 2)) -> Item:
    kind = draw(st.sampled_from(kinds))
    if kind == "audio":
        return Item("audio", audio=draw(st.integers(1, 6)))
    h, w = m * draw(st.integers(1, 3)), m * draw(st.integers(1, 3))
    if kind == "image":
        return Item("image", (draw(st.sampled_from(image_t)), h, w))
    t = draw(st.integers(1, 5))
    spg = draw(st.sampled_from(spgs))
    if kind == "aiv":
        return Item("aiv", (t, h, w), spg, audio=draw(st.integers(1, 90)))
    return Item("video", (t, h, w), spg)


@st.composite
def layouts(draw, m: int, kinds: tuple[str, ...], min_tail: int = 1, **kw) -> tuple[list[tuple[int, Item]], int]:
    """Items with text before each and after the last (transformers needs at least one token)."""
    count = draw(st.integers(0, 4))
    layout = [(draw(st.integers(0, 4)), draw(items(m, kinds, **kw))) for _ in range(count)]
    return layout, draw(st.integers(min_tail, 4))


# ==================================================================================================== transformers


class _Qwen2VL:
    get_rope_index = Qwen2VLModel.get_rope_index
    get_vision_position_ids = Qwen2VLModel.get_vision_position_ids

    def __init__(self, config):
        self.config = config


class _Qwen25VL(_Qwen2VL):
    get_rope_index = Qwen2_5_VLModel.get_rope_index
    get_vision_position_ids = Qwen2_5_VLModel.get_vision_position_ids


class _Omni:
    get_rope_index = OmniModel.get_rope_index
    get_llm_pos_ids_for_vision = OmniModel.get_llm_pos_ids_for_vision
    get_chunked_index = OmniModel.get_chunked_index

    def __init__(self, config):
        self.config = config
        self.spatial_merge_size = config.vision_config.spatial_merge_size


@functools.cache
def vl_config(family: str, m: int, tps: int = 2):
    if family == "qwen2_vl":
        return Qwen2VLConfig(vision_config={"spatial_merge_size": m})
    return Qwen2_5_VLConfig(vision_config={"spatial_merge_size": m, "tokens_per_second": tps})


@functools.cache
def omni_config(m: int, pps: int = 25, spc: int = 2):
    return Qwen2_5OmniThinkerConfig(
        vision_config={"spatial_merge_size": m},
        position_id_per_seconds=pps,
        seconds_per_chunk=spc,
        image_token_index=IMG,
        video_token_index=VID,
        audio_token_index=AUD,
        vision_start_token_id=VS,
        vision_end_token_id=VE,
        audio_start_token_id=AS,
        audio_end_token_id=AE,
    )


def _grids(built: Built, kinds: tuple[str, ...]) -> torch.Tensor | None:
    rows = [it.grid for it in built.items if it.kind in kinds]
    return torch.tensor(rows) if rows else None


def hf_vl(family: str, config, built: Built, spg_none: bool = False) -> tuple[torch.Tensor, int]:
    ref = (_Qwen2VL if family == "qwen2_vl" else _Qwen25VL)(config)
    kwargs = {
        "input_ids": torch.tensor([built.tokens]),
        "mm_token_type_ids": torch.tensor([built.types]),
        "image_grid_thw": _grids(built, ("image",)),
        "video_grid_thw": _grids(built, ("video",)),
    }
    if family == "qwen2_5_vl" and not spg_none and kwargs["video_grid_thw"] is not None:
        kwargs["second_per_grid_ts"] = torch.tensor([it.spg for it in built.items if it.kind == "video"])
    positions, delta = ref.get_rope_index(**kwargs)
    return positions[:, 0], int(delta)


def hf_omni(config, built: Built, spg_one: bool = False) -> tuple[torch.Tensor, int]:
    audio = [4 * it.audio for it in built.items if it.kind in ("audio", "aiv")]  # 4L input frames -> L tokens
    videos = [it for it in built.items if it.kind in ("video", "aiv")]
    positions, delta = _Omni(config).get_rope_index(
        input_ids=torch.tensor([built.tokens]),
        image_grid_thw=_grids(built, ("image",)),
        video_grid_thw=_grids(built, ("video", "aiv")),
        attention_mask=torch.ones(1, len(built.tokens), dtype=torch.long),
        use_audio_in_video=any(it.kind == "aiv" for it in built.items),
        audio_seqlens=torch.tensor(audio) if audio else None,
        second_per_grids=torch.tensor([1.0 if spg_one else it.spg for it in videos]) if videos else None,
    )
    return positions[:, 0], int(delta)


def ours(spec: MropeSpec, built: Built) -> tuple[torch.Tensor, int]:
    return mrope_positions(spec, len(built.tokens), built.grids, offset=0, next_position=0)


# ==================================================================================================== vs transformers


@SETTINGS
@given(data=st.data(), family=st.sampled_from(["qwen2_vl", "qwen2_5_vl"]), m=st.sampled_from([1, 2]))
def test_qwen_vl_matches_transformers(data, family, m):
    """transformers 5.23's own rule ("spatial") always; the Qwen rule ("max") wherever the two agree."""
    tps = data.draw(st.sampled_from([1, 2, 3, 4, 25]))
    config = vl_config(family, m, tps)
    built = build(*data.draw(layouts(m, ("image", "video"))), m)
    expected, hf_delta = hf_vl(family, config, built)

    spatial, spatial_after = ours(MropeSpec.from_config(config, vision_advance="spatial"), built)
    assert torch.equal(spatial, expected)
    positions, after = ours(MropeSpec.from_config(config), built)
    if torch.equal(positions, spatial) and after == spatial_after:
        assert after - len(built.tokens) == hf_delta


@SETTINGS
@given(data=st.data(), family=st.sampled_from(["qwen2_vl", "qwen2_5_vl"]), m=st.sampled_from([1, 2]))
def test_qwen_vl_max_rule_matches_transformers_omni_code(data, family, m):
    """The "max" rule on long videos, checked against the Omni implementation (which keeps it) set up to compute the
    same temporal offsets: Qwen2-VL is Omni with 1 position per second and 1 s per grid."""
    tps = data.draw(st.sampled_from([1, 2, 4]))
    spec = MropeSpec.from_config(vl_config(family, m, tps))
    built = build(*data.draw(layouts(m, ("image", "video"), spgs=EXACT_SPG, image_t=(1,))), m)
    pps = 1 if family == "qwen2_vl" else tps
    expected, hf_delta = hf_omni(omni_config(m, pps), built, spg_one=family == "qwen2_vl")
    positions, after = ours(spec, built)
    assert torch.equal(positions, expected)
    assert after - len(built.tokens) == hf_delta


@SETTINGS
@given(data=st.data(), m=st.sampled_from([1, 2]), pps=st.sampled_from([25, 7]))
def test_omni_matches_transformers(data, m, pps):
    config = omni_config(m, pps)
    built = build(*data.draw(layouts(m, ("image", "video", "audio"))), m)
    expected, hf_delta = hf_omni(config, built)
    positions, after = ours(MropeSpec.from_config(config), built)
    assert torch.equal(positions, expected)
    assert after - len(built.tokens) == hf_delta


@SETTINGS
@given(data=st.data(), m=st.sampled_from([1, 2]), pps=st.sampled_from([25, 10]), spc=st.sampled_from([2, 1, 3]))
def test_omni_audio_in_video_matches_transformers(data, m, pps, spc):
    """transformers' use_audio_in_video is all or nothing, so every video here carries its audio."""
    config = omni_config(m, pps, spc)
    built = build(*data.draw(layouts(m, ("image", "aiv", "audio"))), m)
    expected, hf_delta = hf_omni(config, built)
    positions, after = ours(MropeSpec.from_config(config), built)
    assert torch.equal(positions, expected)
    if after - len(built.tokens) != hf_delta:
        # transformers places the end markers after the last chunk, not after the item's largest position, yet
        # reports its delta from the largest position of all: only an interleaved item reaching past its end
        # markers makes the two differ
        assert any(
            int(positions[:, g.start : g.end].max()) > int(positions[0, g.end - 1])
            for g in built.grids
            if g.audio_length is not None
        )
        assert hf_delta == int(positions.max()) + 1 - len(built.tokens)


@pytest.mark.parametrize(
    ("family", "scale", "spg", "t"),
    [("qwen2_5_vl", 10, 0.9, 5), ("qwen2_5_omni", 10, 0.9, 5), ("qwen2_5_omni", 25, 0.7, 8)],
)
def test_temporal_offsets_round_like_transformers(family, scale, spg, t):
    """float32 products truncated to integers: the order of the multiplications shows in these cases."""
    item = Item("video", (t, 2, 2), spg)
    built = build([(2, item)], 1, 2)
    if family == "qwen2_5_vl":
        config = vl_config(family, 2, scale)
        expected, _ = hf_vl(family, config, built)
        spec = MropeSpec.from_config(config, vision_advance="spatial")
    else:
        config = omni_config(2, scale)
        expected, _ = hf_omni(config, built)
        spec = MropeSpec.from_config(config)
    positions, _ = ours(spec, built)
    assert torch.equal(positions, expected)
    steps, spg32 = torch.arange(t), torch.tensor(spg)
    other_order = (steps * spg32 * scale) if family == "qwen2_5_vl" else (steps * (spg32 * scale))
    assert not torch.equal(positions[0, 3 : 3 + t], other_order.long() + 3)  # the case tells the orders apart


def test_audio_in_video_chunks_when_time_jumps_over_chunks():
    """Frames 50 positions apart with 25-position chunks: transformers opens one chunk per element to catch up."""
    config = omni_config(2, 25, 1)
    built = build([(1, Item("aiv", (3, 4, 4), 2.0, audio=120)), (2, Item("audio", audio=3))], 2, 2)
    expected, _ = hf_omni(config, built)
    positions, _ = ours(MropeSpec.from_config(config), built)
    assert torch.equal(positions, expected)


def test_qwen25_vl_without_second_per_grid_is_one_second():
    config = vl_config("qwen2_5_vl", 2, 2)
    built = build([(3, Item("video", (4, 4, 2), None)), (1, Item("image", (1, 2, 4)))], 2, 2)
    expected, hf_delta = hf_vl("qwen2_5_vl", config, built, spg_none=True)
    positions, after = ours(MropeSpec.from_config(config, vision_advance="spatial"), built)
    assert torch.equal(positions, expected)
    assert after - len(built.tokens) == hf_delta  # the last token holds the largest position here
    assert positions[0, 4:12].tolist() == [4, 4, 6, 6, 8, 8, 10, 10]  # 2 positions per second, 1 s per grid


def test_long_video_qwen25_vl_reported_upstream():
    """The video of huggingface/transformers#45381: 15 text tokens, grid (84, 24, 32), merge 2, 2 positions per
    second, 2 s per grid. transformers <= 5.2 resumed text at 348 after it; 5.3+ (and "spatial") at 31."""
    spec = MropeSpec("qwen2_5_vl", 2, time_scale=2)
    video = MediaGrid("video", 15, 84 * 12 * 16, (84, 24, 32), second_per_grid=2.0)
    count = 15 + video.length + 10
    positions, after = mrope_positions(spec, count, [video])
    assert positions[:, 14].tolist() == [14, 14, 14]
    assert positions[:, 15].tolist() == [15, 15, 15]
    assert positions[:, video.end - 1].tolist() == [347, 26, 30]
    assert positions[:, video.end].tolist() == [348, 348, 348]
    assert after == 358
    spatial = MropeSpec("qwen2_5_vl", 2, time_scale=2, vision_advance="spatial")
    positions, after = mrope_positions(spatial, count, [video])
    assert positions[:, video.end].tolist() == [31, 31, 31]
    assert after == 41


def test_qwen2_vl_small_video_by_hand():
    spec = MropeSpec("qwen2_vl", 2)
    video = MediaGrid("video", 2, 4, (4, 2, 2))  # 4 frames of 1 token
    positions, after = mrope_positions(spec, 7, [video])
    assert positions.tolist() == [[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 2, 2, 2, 6], [0, 1, 2, 2, 2, 2, 6]]
    assert after == 7


# ==================================================================================================== splitting


def _spec(data, m: int) -> tuple[MropeSpec, tuple[str, ...]]:
    family = data.draw(st.sampled_from(["qwen2_vl", "qwen2_5_vl", "qwen2_5_omni"]))
    if family == "qwen2_5_omni":
        spec = MropeSpec(family, m, time_scale=data.draw(st.sampled_from([25, 7])), seconds_per_chunk=2)
        return spec, ("image", "video", "audio", "aiv")
    advance = data.draw(st.sampled_from(["max", "spatial"]))
    return MropeSpec(family, m, time_scale=data.draw(st.sampled_from([1, 2])), vision_advance=advance), (
        "image",
        "video",
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), m=st.sampled_from([1, 2]))
def test_any_split_outside_items_gives_the_same_positions(data, m):
    spec, kinds = _spec(data, m)
    layout, tail = data.draw(layouts(m, kinds, min_tail=0))
    built = build(layout, tail, m)
    total = len(built.tokens)
    whole, whole_after = ours(spec, built)

    inside = {i for g in built.grids for i in range(g.start + 1, g.end)}
    cuts = data.draw(st.sets(st.sampled_from([i for i in range(total + 1) if i not in inside])))
    bounds = sorted({0, total} | cuts)
    pieces, position = [], 0
    only_inside = data.draw(st.booleans())  # pass just the window's items, or all of them
    for lo, hi in itertools.pairwise(bounds):
        media = [g for g in built.grids if lo <= g.start < hi] if only_inside else built.grids
        part, after = mrope_positions(spec, hi - lo, media, offset=lo, next_position=position)
        # the position after a prefix is what the whole sequence's next text token would get
        assert after == mrope_positions(spec, hi, built.grids)[1]
        pieces.append(part)
        position = after
    assert torch.equal(torch.cat(pieces, dim=1) if pieces else whole, whole)
    assert position == whole_after


def test_decode_steps_continue_from_after():
    spec = MropeSpec("qwen2_5_omni", 2)
    image = MediaGrid("image", 3, 4, (1, 4, 4))
    prompt, after = mrope_positions(spec, 8, [image])
    both, _ = mrope_positions(spec, 11, [image])
    assert torch.equal(both[:, :8], prompt)
    assert both[:, 8:].tolist() == [[after, after + 1, after + 2]] * 3


def test_text_only_and_empty():
    spec = MropeSpec("qwen2_vl", 2)
    positions, after = mrope_positions(spec, 5, [], offset=10, next_position=7)
    assert positions.tolist() == [[7, 8, 9, 10, 11]] * 3 and positions.dtype == torch.long
    assert after == 12
    positions, after = mrope_positions(spec, 0, [], offset=4)
    assert positions.shape == (3, 0) and after == 4


# ==================================================================================================== errors


def test_a_window_cutting_an_item_is_refused():
    spec = MropeSpec("qwen2_vl", 2)
    image = MediaGrid("image", 2, 4, (1, 4, 4))
    with pytest.raises(ValueError, match="cuts the image at \\[2, 6\\)"):
        mrope_positions(spec, 4, [image])  # [0, 4) ends inside
    with pytest.raises(ValueError, match="cuts the image"):
        mrope_positions(spec, 4, [image], offset=4, next_position=4)  # [4, 8) starts inside


@pytest.mark.parametrize(
    ("spec", "grid", "match"),
    [
        (MropeSpec("qwen2_vl", 2), MediaGrid("image", 0, 5, (1, 4, 4)), "holds 5 tokens but grid"),
        (MropeSpec("qwen2_5_vl", 2), MediaGrid("video", 0, 8, (3, 4, 4), 1.0), "holds 8 tokens"),
        (MropeSpec("qwen2_vl", 2), MediaGrid("image", 0, 4, (1, 3, 4)), "not divisible by the merge size 2"),
        (MropeSpec("qwen2_5_omni", 2), MediaGrid("video", 0, 10, (2, 4, 4), 1.0, audio_length=3), "4 markers"),
        (MropeSpec("qwen2_vl", 2), MediaGrid("audio", 0, 5), "takes no audio"),
        (MropeSpec("qwen2_5_vl", 2), MediaGrid("video", 0, 15, (2, 4, 4), 1.0, audio_length=3), "Omni feature"),
    ],
)
def test_an_item_that_does_not_fit_is_refused(spec, grid, match):
    with pytest.raises(ValueError, match=match):
        mrope_positions(spec, 20, [grid])


def test_overlapping_items_are_refused():
    spec = MropeSpec("qwen2_vl", 1)
    a, b = MediaGrid("image", 0, 4, (1, 2, 2)), MediaGrid("image", 3, 4, (1, 2, 2))
    with pytest.raises(ValueError, match="overlap"):
        mrope_positions(spec, 10, [b, a])


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: MediaGrid("image", 0, 4), "needs grid_thw"),
        (lambda: MediaGrid("image", 0, 4, (1, 0, 2)), "three positive sizes"),
        (lambda: MediaGrid("audio", 0, 4, (1, 2, 2)), "no grid_thw"),
        (lambda: MediaGrid("text", 0, 4), "unknown media kind"),
        (lambda: MediaGrid("image", 0, 0, (1, 2, 2)), "length >= 1"),
        (lambda: MediaGrid("video", 0, 4, (1, 2, 2), float("nan")), "second_per_grid"),
        (lambda: MediaGrid("image", 0, 9, (1, 2, 2), audio_length=5), "audio_length"),
        (lambda: MropeSpec("qwen3_vl", 2), "unknown mRoPE family"),
        (lambda: MropeSpec("qwen2_5_omni", 2, vision_advance="spatial"), "Omni always"),
        (lambda: MropeSpec("qwen2_vl", 0), "spatial_merge_size"),
        (lambda: mrope_positions(MropeSpec("qwen2_vl", 1), 3, offset=-1), "offset"),
        (lambda: MropeSpec.from_config(SimpleNamespace(model_type="qwen3_omni_moe")), "no mRoPE rules"),
        (lambda: MropeSpec.from_config(SimpleNamespace(model_type="qwen2_vl")), "spatial_merge_size"),
    ],
)
def test_bad_arguments_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ==================================================================================================== configs


def test_spec_from_transformers_configs():
    assert MropeSpec.from_config(vl_config("qwen2_vl", 2)) == MropeSpec(
        "qwen2_vl", 2, time_scale=1.0, image_token_id=151655, video_token_id=151656
    )
    spec = MropeSpec.from_config(vl_config("qwen2_5_vl", 1, 4), vision_advance="spatial")
    assert (spec.family, spec.spatial_merge_size, spec.time_scale, spec.vision_advance) == (
        "qwen2_5_vl",
        1,
        4.0,
        "spatial",
    )
    thinker = omni_config(2, 13, 3)
    spec = MropeSpec.from_config(thinker)
    assert (spec.family, spec.time_scale, spec.seconds_per_chunk) == ("qwen2_5_omni", 13.0, 3.0)
    assert (spec.image_token_id, spec.video_token_id, spec.audio_token_id) == (IMG, VID, AUD)
    whole = Qwen2_5OmniConfig(thinker_config=thinker.to_dict())
    assert MropeSpec.from_config(whole) == spec
