"""SmolVLM / Idefics3 images: the prompt writes each image's tiles and global image exactly as transformers' own
processor does (token for token, pixel for pixel), whatever the tile grid."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image

from chat.models import load_model
from tests.chat.models.mm_helpers import image, png, user


@pytest.fixture(scope="module")
def smolvlm():
    torch.set_num_threads(1)
    return load_model("tiny-smolvlm")


@pytest.mark.parametrize("sizes", [[(60, 50), (90, 40)], [(20, 20)], [(30, 64), (64, 64), (10, 50)]])
def test_the_prompt_is_the_processors(smolvlm, sizes):
    from transformers import Idefics3Processor

    pictures = [png(i + 1, width=w, height=h) for i, (w, h) in enumerate(sizes)]
    pieces: list = ["Look: "]
    for data in pictures:
        pieces += [image(data), " and "]
    messages = [{"role": "system", "content": "be brief"}, user(*pieces, "?")]
    prompt = smolvlm.render_prompt(messages)

    template_content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image"} for p in pieces]
    template_content.append({"type": "text", "text": "?"})
    tokenizer = smolvlm._tokenizer
    text = tokenizer.apply_chat_template(
        [messages[0], {"role": "user", "content": template_content}], tokenize=False, add_generation_prompt=True
    )
    processor = Idefics3Processor(
        image_processor=smolvlm.family.preparers["image"].processor, tokenizer=tokenizer, image_seq_len=4
    )
    decoded = [Image.open(io.BytesIO(data)).convert("RGB") for data in pictures]
    expected = processor(text=text, images=[decoded], return_tensors="pt")
    assert expected["input_ids"][0].tolist() == list(prompt.tokens)
    ours = torch.cat([it.prepared.inputs["pixel_values"] for it in prompt.items], dim=1)
    assert torch.equal(expected["pixel_values"], ours)
    assert len(prompt.items) == len(sizes)
    for it in prompt.items:  # a span runs from the first <fake_token_around_image> to the last
        span = prompt.tokens[it.span.start : it.span.end]
        around = tokenizer.convert_tokens_to_ids("<fake_token_around_image>")
        assert span[0] == around and span[-1] == around


@pytest.mark.parametrize(
    ("size", "written"),
    [
        ((32, 16), "[IMG][IMG][IMG_END]"),  # width x height in pixels: two tokens in one row
        ((16, 32), "[IMG][IMG_BREAK][IMG][IMG_END]"),  # two rows
        ((48, 32), "[IMG][IMG][IMG][IMG_BREAK][IMG][IMG][IMG][IMG_END]"),
    ],
)
def test_a_pixtral_image_is_written_in_rows_with_breaks(size, written):
    """Mistral 3 (transformers' PixtralProcessor.replace_image_token, which cannot be imported here without
    torchvision): each row of 16-px squares is [IMG] tokens and [IMG_BREAK], the last [IMG_BREAK] becomes [IMG_END]."""
    model = load_model("tiny-mistral3")
    prompt = model.render_prompt([user("Look: ", image(png(7, width=size[0], height=size[1])), "?")])
    (item,) = prompt.items
    tokenizer = model._tokenizer
    assert tokenizer.decode(prompt.tokens[item.span.start : item.span.end]) == written


@pytest.mark.parametrize("size", [(1, 1), (16, 16), (3, 700), (2000, 7)])
def test_a_pixtral_image_it_cannot_take_is_refused_by_name_before_any_compute(size):
    """Mistral 3: an image of one merged patch (transformers' patch merger fails on it) or one with a side the
    processor would resize to nothing is a typed error naming the item; nothing is computed or stored."""
    from cache import PrefixCache
    from chat.engine.errors import InvalidMediaError
    from chat.engine.events import TurnRequest
    from chat.engine.sampling import SamplingParams
    from chat.engine.turn import Turn

    model = load_model("tiny-mistral3")
    where = "messages[0].content[3]"
    bad = image(png(5, width=size[0], height=size[1]), item=where)
    cache, entries = PrefixCache(), len(model.media_store)
    request = TurnRequest([user("Look: ", image(png(7, width=32, height=16)), " and ", bad, "?")], SamplingParams())
    with pytest.raises(InvalidMediaError) as err:
        Turn(model, cache, request).begin()
    assert err.value.item == where and ("too small" in str(err.value) or "too narrow" in str(err.value))
    assert cache.stats().entries == 0 and len(model.media_store) == entries
