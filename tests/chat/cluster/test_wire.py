"""What crosses between ingress and replicas: engine errors survive as data; the lost-replica error is typed."""

import pickle

from chat.cluster.wire import Failed, RemoteFailure, ReplicaLostError, portable_done
from chat.engine.errors import ContextOverflowError, EngineClosedError, EngineError, InvalidMediaError
from chat.engine.events import Done, Timings, Usage
from chat.protocol.errors import ErrorCode
from chat.server.errors import code_of, describe


def through_the_wire(exc):
    return pickle.loads(pickle.dumps(Failed.of(exc))).error()


def test_an_engine_error_comes_back_as_itself():
    overflow = ContextOverflowError(5000, 4096)
    back = through_the_wire(overflow)
    assert type(back) is ContextOverflowError and str(back) == str(overflow)
    assert (back.prompt_tokens, back.context_window) == (5000, 4096)
    assert code_of(back) is ErrorCode.CONTEXT_OVERFLOW and describe(back) == describe(overflow)  # same status, code


def test_error_attributes_that_name_the_item_survive():
    back = through_the_wire(InvalidMediaError("messages[1].content[0]", "not an image"))
    assert back.item == "messages[1].content[0]" and describe(back).param == "messages[1].content[0]"


def test_an_unknown_or_foreign_class_comes_back_as_a_plain_engine_error():
    for module, name in (("chat.engine.errors", "NoSuchError"), ("os", "PathLike"), ("chat.engine.errors", "Done")):
        back = Failed(module, name, "boom", {}).error()
        assert type(back) is EngineError and str(back) == "boom"


def test_a_lost_replica_is_unavailable_with_a_readable_message():
    lost = ReplicaLostError("r1")
    assert isinstance(lost, EngineClosedError) and lost.replica == "r1"
    reported = describe(lost)
    assert (reported.transport.status, reported.code) == (503, ErrorCode.UNAVAILABLE)
    assert "r1" in reported.message and "send the turn again" in reported.message
    assert "the replica chosen for it" in str(ReplicaLostError(None))


def test_a_failed_done_carries_a_picklable_error():
    class Unpicklable(Exception):
        def __reduce__(self):
            raise TypeError("no")

    done = Done("", (), "error", Usage(1, 0, 0), Timings(0, 0, 0, 0), error=Unpicklable("model broke"))
    sent = pickle.loads(pickle.dumps(portable_done(done)))
    assert isinstance(sent.error, RemoteFailure) and "model broke" in str(sent.error)
    ok = Done("hi", (1,), "stop", Usage(1, 0, 1), Timings(0, 0, 0, 0))
    assert portable_done(ok) is ok
