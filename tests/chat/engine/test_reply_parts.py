"""chat.engine.reply_parts: a reply's writer (tokens -> streamed text, held back while a stop string may start, the
finish reason), its clock's timings, and the speculation's drafts and tally."""

from __future__ import annotations

from chat.engine.events import Delta, TurnRequest
from chat.engine.reply_parts import ReplyWriter, Speculation, TurnClock
from chat.engine.sampling import SamplingParams, TokenLogprob
from tests.chat.engine.fakes import END, FakeRuntime


def writer(stop: list[str] | None = None, max_tokens: int = 100) -> ReplyWriter:
    request = TurnRequest([], SamplingParams(stop=stop or []))
    return ReplyWriter(FakeRuntime(), request, max_tokens)


def test_text_streams_token_by_token_and_the_end_token_stops_without_text():
    w = writer()
    assert w.accept(ord("h")) == ([Delta("h", (ord("h"),))], None)
    lp = TokenLogprob(ord("i"), -0.5)
    assert w.accept(ord("i"), lp) == ([Delta("i", (ord("i"),), (lp,))], None)
    assert w.accept(END) == ([], "stop")
    assert w.tokens == [ord("h"), ord("i"), END] and "".join(w.text) == "hi" and w.logprobs == [lp]


def test_the_end_tokens_log_probability_is_reported_in_an_empty_delta():
    w = writer()
    lp = TokenLogprob(END, -0.1)
    assert w.accept(END, lp) == ([Delta("", (END,), (lp,))], "stop")
    assert w.logprobs == [lp] and w.text == []


def test_text_that_may_start_a_stop_string_is_held_back_and_the_stop_string_never_shown():
    w = writer(stop=["cd"])
    out = [w.accept(ord(c)) for c in "abcd"]
    assert [events for events, _ in out] == [
        [Delta("", (ord("a"),))],  # "a" held back: a last character may start the stop string
        [Delta("a", (ord("b"),))],
        [Delta("b", (ord("c"),))],
        [],  # "cd": the stop string; nothing of it is emitted
    ]
    assert [reason for _, reason in out] == [None, None, None, "stop"]
    assert "".join(w.text) == "ab" and w.flush() == []


def test_the_reply_ends_at_max_tokens_and_a_flush_gives_what_was_held_back():
    w = writer(stop=["zz"], max_tokens=2)
    assert w.accept(ord("a"))[1] is None
    assert w.accept(ord("b"))[1] == "length"
    assert w.flush() == [Delta("b", ())]
    assert "".join(w.text) == "ab"


def test_a_character_split_over_tokens_comes_out_whole():
    w = writer()
    first, second = "é".encode()
    assert w.accept(first) == ([Delta("", (first,))], None)
    assert w.accept(second) == ([Delta("é", (second,))], None)


def test_the_clock_gives_each_phase_from_its_marks():
    clock = TurnClock(start=0.0, prefill_start=1.0, prefill_end=1.5, first_token=2.0, last_token=4.0)
    t = clock.timings(5)
    assert (t.ttft_ms, t.prefill_ms, t.decode_tokens_per_s) == (2000.0, 500.0, 2.0)  # 4 tokens after the first in 2 s
    assert t.total_ms >= 4000.0  # request start -> now


def test_a_clock_without_marks_reports_no_prefill_and_no_decode_rate():
    clock = TurnClock()
    t = clock.timings(0)
    assert t.prefill_ms == 0.0 and t.decode_tokens_per_s == 0.0
    assert 0.0 <= t.ttft_ms <= t.total_ms


def test_speculation_drafts_within_the_room_and_tallies_what_was_kept():
    spec = Speculation([1, 2, 3, 1, 2], most=4)
    assert spec.draft(10) == [3, 1, 2]  # what followed the earlier (1, 2)
    assert spec.draft(1) == [3]  # no more than the room
    spec.record(3, 0)
    spec.record(2, 2)
    assert (spec.drafted, spec.accepted) == (5, 2)
    assert spec.length.now == 4  # down by one after a rejected draft, up by two (capped) after a kept one
