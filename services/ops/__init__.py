"""Operator tools over the event log: load an export, fold it, build timelines, diagnose hangs."""
