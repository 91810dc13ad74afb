"""chat.protocol.base: every wire type is closed (an unknown field is refused), immutable, and refuses NaN and
infinity."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from chat.protocol.base import WireModel


class Point(WireModel):
    x: float


@pytest.mark.parametrize("data", [{"x": 1.0, "y": 2.0}, {"x": math.nan}, {"x": math.inf}, {"x": -math.inf}])
def test_unknown_fields_and_non_finite_numbers_are_refused(data):
    with pytest.raises(ValidationError):
        Point.model_validate(data)


def test_a_wire_value_cannot_be_changed():
    point = Point(x=1.0)
    with pytest.raises(ValidationError):
        point.x = 2.0  # type: ignore[misc]
    assert point == Point(x=1.0) and hash(point) == hash(Point(x=1.0))
