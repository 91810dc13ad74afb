"""Limits are validated and frozen."""

from __future__ import annotations

import dataclasses

import pytest

from modalities.limits import AudioLimits, ImageLimits, MediaLimits, VideoLimits


@pytest.mark.parametrize("cls", [ImageLimits, AudioLimits, VideoLimits])
def test_defaults_are_positive_and_frozen(cls: type) -> None:
    limits = cls()
    for field in dataclasses.fields(limits):
        assert getattr(limits, field.name) > 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.max_bytes = 1


@pytest.mark.parametrize("bad", [0, -1, True, "10", float("nan")])
def test_non_positive_limits_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        ImageLimits(max_bytes=bad)


def test_media_limits_groups_the_three() -> None:
    limits = MediaLimits(image=ImageLimits(max_pixels=10))
    assert limits.image.max_pixels == 10
    assert limits.audio == AudioLimits()
    assert limits.video == VideoLimits()
