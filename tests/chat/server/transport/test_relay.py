import asyncio
import threading

from chat.server.transport.relay import LoopRelay, relay_for


def test_calls_made_while_a_wake_up_is_pending_run_in_that_one_wake_up_in_order():
    loop = asyncio.new_event_loop()
    try:
        relay, seen = LoopRelay(loop), []
        worker = threading.Thread(target=lambda: [relay.call(seen.append, i) for i in range(100)])
        worker.start()
        worker.join()
        assert seen == [] and relay.wakeups == 1  # one wake-up asked for 100 calls
        loop.run_until_complete(asyncio.sleep(0))
        assert seen == list(range(100))
        relay.call(seen.append, 100)  # nothing pending any more: a new wake-up
        loop.run_until_complete(asyncio.sleep(0))
        assert seen[-1] == 100 and relay.wakeups == 2
    finally:
        loop.close()


def test_a_failing_call_does_not_drop_the_calls_after_it():
    loop = asyncio.new_event_loop()
    try:
        relay, seen = LoopRelay(loop), []
        relay.call(lambda: 1 / 0)
        relay.call(seen.append, "after")
        loop.run_until_complete(asyncio.sleep(0))
        assert seen == ["after"]
    finally:
        loop.close()


def test_a_call_after_the_loop_closed_is_dropped_quietly():
    loop = asyncio.new_event_loop()
    relay = LoopRelay(loop)
    loop.close()
    relay.call(print, "never")
    relay.call(print, "never")
    assert relay.wakeups == 2  # each found no pending wake-up: the failed one was forgotten


def test_each_loop_has_one_relay():
    one, two = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        assert relay_for(one) is relay_for(one) and relay_for(one) is not relay_for(two)
    finally:
        one.close()
        two.close()
