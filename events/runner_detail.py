"""A failed runner's detail (`RunnerStatusChanged.detail`): a headline anyone may read, then, for
operators only, what the process last wrote to stderr (its log lines name other tasks, a traceback
the code). The master's retire reason, which becomes each failed task's error and so reaches the
API's clients, takes the headline alone; `shoal diagnose` and the timeline show it all."""

from __future__ import annotations

STDERR_MARK = "\nstderr tail:\n"


def exit_detail(headline: str, stderr_tail: str) -> str:
    """The detail of a runner process that exited: `headline`, then its stderr's tail, if any."""
    return f"{headline}{STDERR_MARK}{stderr_tail}" if stderr_tail.strip() else headline


def detail_headline(detail: str) -> str:
    """What of `detail` may be shown to a client: all of it but the stderr tail."""
    return detail.split(STDERR_MARK, 1)[0]
