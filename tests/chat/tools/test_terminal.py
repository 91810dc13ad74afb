import io
import re

from cache import PrefixCache
from chat.engine.sampling import SamplingParams
from chat.tools.terminal import chat_loop
from tests.chat.engine.fakes import FakeRuntime


def test_terminal_chat_prints_cached_tokens_ttft_and_speed_per_turn():
    stdin = io.StringIO("hello\nand more\n/regen\n/reset\nfresh\n/quit\n")
    stdout = io.StringIO()
    assert chat_loop(FakeRuntime(), PrefixCache(), SamplingParams(), system="be brief", stdin=stdin, stdout=stdout) == 0
    stats = re.findall(
        r"\[([\d,]+) of ([\d,]+) prompt tokens cached · first token [\d.]+ s · [\d.]+ tok/s · stop\]", stdout.getvalue()
    )
    cached = [int(c.replace(",", "")) for c, _ in stats]
    prompts = [int(p.replace(",", "")) for _, p in stats]
    assert len(stats) == 4
    assert cached[0] == 0  # first turn: nothing cached
    assert cached[1] > 0  # second turn reuses the first
    assert cached[2] == prompts[2] - 1  # regenerate: the same prompt again, one token short
    assert 0 < cached[3] < prompts[3]  # after /reset only the system prompt is shared


def test_a_thinking_models_thinking_is_printed_dimmed_apart_from_its_answer():
    from chat.engine.reasoning import Markers
    from chat.tools.terminal import DIM, PLAIN

    class Thinker(FakeRuntime):
        reasoning = Markers()

    runtime = Thinker(script=lambda prompt: "<think>hmm, two</think>\n\nIt is two.")
    stdout = io.StringIO()
    chat_loop(runtime, None, SamplingParams(), system=None, stdin=io.StringIO("1+1?\n/quit\n"), stdout=stdout)
    shown = stdout.getvalue()
    dimmed = "".join(re.findall(re.escape(DIM) + "(.*?)" + re.escape(PLAIN), shown, flags=re.S))
    assert dimmed == "hmm, two" and "It is two." in shown and "<think>" not in shown


def test_tool_calls_are_printed_apart_and_their_results_asked_for():
    from chat.tools.terminal import CALL, PLAIN
    from tests.chat.server.test_tools import TOOLS, agent_script

    stdin = io.StringIO("What is the weather in Oslo?\nsunny\n/quit\n")
    stdout = io.StringIO()
    runtime = FakeRuntime(script=agent_script)
    chat_loop(runtime, PrefixCache(), SamplingParams(), system=None, stdin=stdin, stdout=stdout, tools=TOOLS)
    shown = stdout.getvalue()
    calls = re.findall(re.escape(CALL) + r"⚙ (\w+)\((.*?)\) \[call_\w+\]" + re.escape(PLAIN), shown)
    assert calls == [("get_weather", '{"city":"Oslo"}')]
    assert '{"tool_calls"' not in shown  # the call's raw JSON is not printed as text
    assert re.search(re.escape(CALL) + r"result of get_weather \[call_\w+\]>", shown)
    assert "It is sunny in Oslo." in shown and '{"response"' not in shown
    cached = [int(c.replace(",", "")) for c in re.findall(r"\[([\d,]+) of [\d,]+ prompt tokens cached", shown)]
    assert len(cached) == 2 and cached[1] > 0  # the answer after the result reuses the call
