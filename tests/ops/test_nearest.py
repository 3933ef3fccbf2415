from __future__ import annotations

from services.ops.nearest import nearest_ids, unknown_id_message

IDS = ["task_00a1", "task_00b2", "task_f00d", "task_beef", "other"]


def test_close_ids_come_first() -> None:
    assert set(nearest_ids("task_00a2", IDS)[:2]) == {"task_00a1", "task_00b2"}


def test_prefix_fallback_when_nothing_is_close() -> None:
    assert nearest_ids("task_zzzzzzzzzzzzzzzzzzzz", IDS[:2]) == ["task_00a1", "task_00b2"]


def test_messages_say_what_exists() -> None:
    assert "nearest: task_00a1" in unknown_id_message("task", "task_00a9", IDS)
    assert "holds no tasks" in unknown_id_message("task", "x", [])
    assert "holds 1 tasks, e.g. zzz" in unknown_id_message("task", "abcdef", ["zzz"])
