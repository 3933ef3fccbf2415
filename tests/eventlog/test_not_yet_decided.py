"""JetStream's answers that decide nothing about a message (10158: an earlier send of its id is
still being proposed; 10167: the ingest queue is full) are resent, never taken as refusals: the
chaos nemesis found runners failing tasks on 10158 after a lost quorum (issue 46)."""

from __future__ import annotations

import pytest

from eventlog.appender import Appender
from eventlog.endpoint import NatsEndpoint
from eventlog.publish import LogError, LogUnreachable, NotYetDecided, decode_ack
from events.catalogue import LogEvent
from tests.events.builders import Events

IN_PROCESS = b'{"error":{"code":409,"err_code":10158,"description":"duplicate message id is in process"}}'
BUSY = b'{"error":{"code":429,"err_code":10167,"description":"too many requests"}}'
WRONG_SEQ = b'{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"}}'


@pytest.mark.parametrize("payload", [IN_PROCESS, BUSY])
def test_an_answer_that_decides_nothing_is_not_yet_decided(payload: bytes) -> None:
    with pytest.raises(NotYetDecided):
        decode_ack(payload)


def test_a_refusal_stays_a_refusal_and_an_ack_its_seq() -> None:
    with pytest.raises(LogError) as refused:
        decode_ack(WRONG_SEQ)
    assert not isinstance(refused.value, NotYetDecided)
    assert decode_ack(b'{"stream":"SHOAL_EVENTS","seq":12,"duplicate":true}') == 12


class _Scripted(Appender):
    """An Appender whose tries answer from a script (no server): each item is a seq or an exception."""

    def __init__(self, answers: list[int | Exception], retry_seconds: float) -> None:
        super().__init__(NatsEndpoint(url="nats://127.0.0.1:1"), retry_seconds)
        self.answers = answers
        self.tries = 0

    async def _try(self, subject: bytes, headers: bytes, payload: bytes) -> int:
        self.tries += 1
        answer = self.answers.pop(0) if self.answers else NotYetDecided("duplicate message id is in process")
        if isinstance(answer, Exception):
            raise answer
        return answer


def _event() -> LogEvent:
    return Events().created("t1")


async def test_the_appender_resends_until_the_server_decides() -> None:
    appender = _Scripted([NotYetDecided("in process"), NotYetDecided("in process"), 42], retry_seconds=10)
    assert await appender.append(_event()) == 42
    assert appender.tries == 3


async def test_an_answer_never_decided_within_the_retry_time_is_unreachable_not_refused() -> None:
    appender = _Scripted([], retry_seconds=0.3)
    with pytest.raises(LogUnreachable):
        await appender.append(_event())
