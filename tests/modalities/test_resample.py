"""The windowed-sinc resampler: exactness against a direct evaluation, pass band, alias rejection, DC, lengths."""

from __future__ import annotations

import numpy as np
import pytest

from modalities import resample as rs
from modalities.resample import resample

RATES = [(44_100, 16_000), (48_000, 16_000), (22_050, 16_000), (8_000, 16_000), (16_000, 44_100), (44_099, 16_000)]


def tone(freq: float, rate: int, seconds: float = 1.0) -> np.ndarray:
    return np.sin(2 * np.pi * freq * np.arange(int(rate * seconds)) / rate).astype(np.float32)


def amplitude(y: np.ndarray, rate: int, freq: float) -> float:
    """Amplitude of ``freq`` in the middle half of ``y`` (edges excluded: the signal is zero outside)."""
    mid = y[len(y) // 4 : 3 * len(y) // 4].astype(np.float64)
    t = np.arange(len(mid)) / rate
    return float(np.abs(mid @ np.exp(-2j * np.pi * freq * t)) * 2 / len(mid))


def direct(x: np.ndarray, src: int, dst: int, n: int) -> float:
    """Output sample ``n`` computed straight from the kernel definition in the module docstring."""
    fc = rs.ROLLOFF * min(1.0, dst / src)
    half = rs.ZERO_CROSSINGS / fc
    p = n * src / dst
    j = np.arange(int(np.floor(p - half)), int(np.ceil(p + half)) + 1)
    t = p - j
    w = np.where(np.abs(t) < half, np.i0(rs.KAISER_BETA * np.sqrt(np.clip(1 - (t / half) ** 2, 0, 1))), 0.0)
    k = fc * np.sinc(fc * t) * w
    k /= k.sum()
    xs = np.where((j >= 0) & (j < len(x)), x[np.clip(j, 0, len(x) - 1)], 0.0)
    return float(xs @ k)


@pytest.mark.parametrize(("src", "dst"), RATES)
def test_matches_the_kernel_definition(src: int, dst: int) -> None:
    x = np.random.default_rng(1).standard_normal(src // 10).astype(np.float32)
    y = resample(x, src, dst)
    assert len(y) == -(-len(x) * dst // src)
    for n in [0, 1, 7, len(y) // 3, len(y) // 2 + 1, len(y) - 1]:
        assert y[n] == pytest.approx(direct(x, src, dst, n), abs=2e-5)


@pytest.mark.parametrize(("src", "dst"), RATES)
def test_pass_band_is_flat(src: int, dst: int) -> None:
    for freq in (100.0, 1_000.0, 0.85 * min(src, dst) / 2):
        gain_db = 20 * np.log10(amplitude(resample(tone(freq, src), src, dst), dst, freq))
        assert abs(gain_db) < 0.01, (freq, gain_db)


@pytest.mark.parametrize("src", [44_100, 48_000, 22_050])
def test_frequencies_above_the_new_nyquist_do_not_alias(src: int) -> None:
    dst = 16_000
    for freq in (8_400.0, 9_000.0, 10_500.0):
        y = resample(tone(freq, src), src, dst)
        mid = y[len(y) // 4 : 3 * len(y) // 4]
        leak_db = 20 * np.log10(np.sqrt(np.mean(mid.astype(np.float64) ** 2)) * np.sqrt(2) + 1e-12)
        assert leak_db < -95, (freq, leak_db)


def test_dc_passes_exactly_and_equal_rates_are_untouched() -> None:
    y = resample(np.full(44_100, 0.25, np.float32), 44_100, 16_000)
    np.testing.assert_allclose(y[200:-200], 0.25, rtol=1e-5)
    x = tone(440, 16_000)
    assert resample(x, 16_000, 16_000) is x
    assert len(resample(np.zeros(0, np.float32), 44_100, 16_000)) == 0


def test_long_input_is_processed_in_chunks() -> None:
    x = np.random.default_rng(2).standard_normal(48_000 * 3).astype(np.float32)  # > _CHUNK outputs per phase
    y = resample(x, 48_000, 16_000)
    assert len(y) == 48_000
    for n in [0, rs._CHUNK - 1, rs._CHUNK, 2 * rs._CHUNK + 5, len(y) - 1]:
        assert y[n] == pytest.approx(direct(x, 48_000, 16_000, n), abs=2e-5)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="1-D"):
        resample(np.zeros((2, 10), np.float32), 16_000, 8_000)
    with pytest.raises(ValueError, match="positive integers"):
        resample(np.zeros(10, np.float32), 0, 8_000)
    with pytest.raises(ValueError, match="positive integers"):
        resample(np.zeros(10, np.float32), 16_000.5, 8_000)
