"""A rank whose ring port another program holds says which port, and what to do about it."""

from __future__ import annotations

from runner.service.main import ring_failure

HOSTS = ["10.0.0.1:29100", "10.0.0.2:29101"]


def test_a_port_held_elsewhere_is_named_with_its_rank_and_the_setting() -> None:
    said = ring_failure("[ring] Couldn't bind socket (error: 98)", HOSTS, 1)
    assert said.startswith("[ring] Couldn't bind socket (error: 98)")  # mlx's words stay first
    assert "10.0.0.2:29101 of rank 1 is held by another program" in said and "ring_base_port" in said


def test_other_ring_errors_pass_unchanged() -> None:
    assert ring_failure("[ring] Connect failed (error: 111)", HOSTS, 0) == "[ring] Connect failed (error: 111)"
