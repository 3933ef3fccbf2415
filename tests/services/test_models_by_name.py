"""Models by Hub id, the pure parts: the model events' fold and subjects, the master telling the
log once why it cannot place its default model, `shoal up`'s progress lines and `/v1/models`'s
cards (the e2e test in tests/e2e/test_hub_models.py runs them in a cluster)."""

from __future__ import annotations

from events.catalogue import InstanceRetired, LogEvent, ModelDownloadProgress, ModelUnavailable, Origin
from events.fold import fold
from events.ids import InstanceId, NodeId, check_token
from events.state import State
from events.subjects import model_subject, model_token, subject_for
from services.api.model_cards import model_card
from services.master.capacity import ModelFacts
from services.master.core import MasterCore, MasterPolicy, UnknownModel
from services.up_progress import UpProgress
from tests.events.builders import Events, fake_stamper

MODEL = "mlx-community/Tiny-4bit"
GIB = 1 << 30


class Unplaceable:
    def facts_of(self, model: str) -> ModelFacts:
        raise UnknownModel(f"model {model!r} cannot be loaded: it is neither cached nor downloadable")


def _download(ev: Events, node: str, done: int, total: int) -> ModelDownloadProgress:
    return ModelDownloadProgress(
        env=ev.stamper(Origin(service="runner", node=node, rank=0)).stamp(),
        node_id=NodeId(node),
        model=MODEL,
        bytes_done=done,
        bytes_total=total,
    )


def _state(events: list[LogEvent]) -> State:
    return fold(enumerate(events, start=1))


def test_a_model_name_becomes_a_valid_distinct_subject_token() -> None:
    names = [MODEL, "mlx-community/Tiny.4bit", "/srv/models/llama-3.2", "tiny", "a" * 300]
    tokens = [model_token(name) for name in names]
    assert all(check_token("model", token) == token for token in tokens)
    assert len(set(tokens)) == len(names)
    ev = Events()
    assert subject_for(_download(ev, "n1", 1, 2)) == f"{model_subject(MODEL, 'download_progress')}.n1"  # its node, last


def test_download_reports_fold_per_node_and_the_latest_wins() -> None:
    ev = Events()
    state = _state([_download(ev, "n1", 10, 100), _download(ev, "n2", 5, 100), _download(ev, "n1", 100, 100)])
    downloads = state.models[MODEL].downloads
    assert {node: (d.bytes_done, d.finished) for node, d in downloads.items()} == {"n1": (100, True), "n2": (5, False)}


def test_the_master_says_once_per_reason_why_its_default_model_cannot_be_placed() -> None:
    ev = Events()
    core = MasterCore(MasterPolicy(models=(MODEL,)), Unplaceable(), fake_stamper("master"))
    state = State()
    said: list[LogEvent] = []
    for event in [ev.node("n1"), ev.node("n2")]:
        state = fold([(state.last_seq + 1, event)], state)
        for decision in core.decide(state, event):
            said.append(decision)
            state = fold([(state.last_seq + 1, decision)], state)
    assert [type(e) for e in said] == [ModelUnavailable]
    assert "neither cached nor downloadable" in state.models[MODEL].unavailable
    assert core.reconcile(state) == []


def test_shoal_up_prints_a_line_per_tenth_of_a_download_and_each_new_reason_once() -> None:
    ev = Events()
    progress = UpProgress(MODEL)
    events: list[LogEvent] = [ev.node("n1")]
    printed: list[str] = []
    for done in (0, GIB // 20, GIB * 35 // 100, GIB * 36 // 100, GIB):
        events.append(_download(ev, "n1", done, GIB))
        printed += progress.lines(_state(events))
    assert [line.split(": ")[2].split(" ")[0] for line in printed] == ["0%", "30%", "100%"]
    assert printed[-1] == f"shoal: n1 downloading {MODEL!r}: 100% (1.00 of 1.00 GiB)"
    events.append(ModelUnavailable(env=ev.master.stamp(), model=MODEL, error="no network"))
    assert progress.lines(_state(events)) == [f"shoal: {MODEL!r} cannot be served: no network"]
    assert progress.lines(_state(events)) == []


def test_a_model_card_names_the_hub_owner_the_shards_and_why_it_is_not_served() -> None:
    ev = Events()
    placed = ev.placed("i1", nodes=("n1", "n2"), layers=8)
    events: list[LogEvent] = [ev.node("n1"), ev.node("n2"), placed, _download(ev, "n2", 3, 10)]
    card = model_card(_state(events), placed.model, context_length=4096)
    assert (card.owned_by, card.context_length, card.ready, card.error) == ("shoal", 4096, False, None)
    assert [(s.node_id, s.start_layer, s.end_layer) for s in card.instances[0].shards] == [
        ("n1", 0, 4),
        ("n2", 4, 8),
    ]
    retired = InstanceRetired(env=ev.master.stamp(), instance_id=InstanceId("i1"), reason="rank 0 failed: gone")
    card = model_card(_state([*events, retired]), placed.model, context_length=None)
    assert card.instances == [] and card.error == "the last attempt to load it failed: rank 0 failed: gone"
    assert model_card(State(), MODEL, None).owned_by == "mlx-community"
