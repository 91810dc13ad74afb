"""The one reply reader (``chat.server.reply.reader``) alone: what each surface's encoder is given for a reply that
thinks, one that may call tools, one that failed, with the thinking split off or left in the text."""

from __future__ import annotations

from chat.engine.events import Delta, Done, Timings, TurnRequest, Usage
from chat.engine.reasoning import Markers
from chat.protocol.tools import ToolDef
from chat.server.reply import tools_api
from chat.server.reply.reader import CallsOut, Failed, Finished, ReasoningOut, ReplyReader, TextOut
from tests.chat.engine.fakes import FakeRuntime

TOOL = ToolDef.model_validate(
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
)
CALL = '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}}]}'


def _done(text: str, finish: str = "stop", error: Exception | None = None) -> Done:
    return Done(text, tuple(text.encode()), finish, Usage(10, 4, len(text)), Timings(1, 1, 1, 1), error)


def _read(reader: ReplyReader, pieces: list[str], finish: str = "stop") -> list:
    out = []
    for piece in pieces:
        out += reader.delta(Delta(piece, tuple(piece.encode())))
    return out + reader.done(_done("".join(pieces), finish))


def test_thinking_comes_apart_from_the_answer_as_it_streams():
    reader = ReplyReader(TurnRequest([]), None, Markers())
    events = _read(reader, ["<think>\nHm", "m.\n</think>\n\nFo", "ur."])
    thought = "".join(e.text for e in events if isinstance(e, ReasoningOut))
    text = "".join(e.text for e in events if isinstance(e, TextOut))
    assert thought.strip() == "Hmm." and text == "Four."
    assert events[-1] == Finished(events[-1].done, "Four.", "Hmm.", (), "stop")


def test_a_reader_that_leaves_the_thinking_in_the_text_keeps_it_in_front_of_the_answer():
    reader = ReplyReader(TurnRequest([]), None, Markers(), split_thinking=False)
    events = _read(reader, ["<think>\nHmm.\n</think>\n\n", "Four."])
    assert not any(isinstance(e, ReasoningOut) for e in events)
    assert events[-1].content == "<think>\nHmm.\n</think>\n\nFour." and events[-1].reasoning is None


def test_a_reply_that_may_call_tools_is_held_then_read_as_its_calls():
    plan = tools_api.plan_tools([TOOL], None, None, FakeRuntime())
    reader = ReplyReader(TurnRequest([]), plan, None)
    events = _read(reader, [CALL[:20], CALL[20:]])
    assert [type(e) for e in events] == [CallsOut, Finished]  # nothing before the reply is done
    (call,) = events[0].calls
    assert call.name == "get_weather" and events[-1].finish == "tool_calls" and events[-1].content is None


def test_a_reply_that_failed_while_generating_is_failed_with_its_done():
    reader = ReplyReader(TurnRequest([]), None, None)
    boom = RuntimeError("boom")
    (event,) = reader.done(_done("x", "error", boom))
    assert isinstance(event, Failed) and event.error is boom and event.done is not None


def test_the_reader_settles_a_reply_that_thought_on_the_engine_it_was_given():
    submitted = []

    class Recorder:
        def submit(self, request, sink):
            submitted.append(request)

    turn = TurnRequest([{"role": "user", "content": "2 + 2?"}])
    ReplyReader(turn, None, Markers(), engine=Recorder()).done(_done("<think>\nHmm.\n</think>\n\nFour."))
    ReplyReader(turn, None, Markers()).done(_done("<think>\nHmm.\n</think>\n\nFour."))  # no engine: not settled
    (settled,) = submitted
    assert settled.messages[-1] == {"role": "assistant", "content": "Four."} and settled.params.max_tokens == 0
