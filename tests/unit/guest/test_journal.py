"""The agent's journal: a start command's output, a line an entry, bounded and numbered."""

from __future__ import annotations

import logging

from aenv.guest.agent.journal import MAX_ENTRIES, MAX_LINE, Journal, JournalHandler


def test_output_becomes_lines_and_a_partial_line_waits_for_its_end() -> None:
    j = Journal()
    j.output(7, "stdout", b"one\ntw")
    j.output(7, "stderr", b"oops\n")
    j.output(7, "stdout", b"o\r\nthree")
    j.ended(7, "exit status 0")
    got, nxt = j.since(0)
    assert [(e.message, e.level, e.fields.get("stream")) for e in got] == [
        ("one", "info", "stdout"), ("oops", "error", "stderr"), ("two", "info", "stdout"),
        ("three", "info", "stdout"), ("start command ended: exit status 0", "info", None)]
    assert [e.seq for e in got] == [1, 2, 3, 4, 5] and nxt == 5
    assert all(e.fields["source"] == "startCmd" for e in got)
    assert j.since(5) == ([], 5)
    assert [e.message for e in j.since(3)[0]] == ["three", "start command ended: exit status 0"]


def test_bounded_in_lines_and_entries_and_a_reboot_reads_from_the_start() -> None:
    j = Journal()
    j.output(1, "stdout", b"x" * (MAX_LINE + 10))  # no newline yet, but too long to wait
    got, _ = j.since(0)
    assert len(got) == 1 and len(got[0].message) == MAX_LINE
    for i in range(MAX_ENTRIES + 5):
        j.add("info", f"m{i}")
    got, nxt = j.since(0, limit=MAX_ENTRIES + 100)
    assert len(got) == MAX_ENTRIES and got[-1].message == f"m{MAX_ENTRIES + 4}"
    assert j.since(10**9, limit=1)[0][0].seq == got[0].seq  # past the end: the journal anew


def test_the_agents_warnings_go_in_its_journal() -> None:
    j = Journal()
    logger = logging.getLogger("aenv.test.journal")
    handler = JournalHandler(j)
    logger.addHandler(handler)
    try:
        logger.info("not this")
        logger.warning("disk %s", "low")
        logger.error("bad")
    finally:
        logger.removeHandler(handler)
    assert [(e.level, e.message, e.fields) for e in j.since(0)[0]] == [
        ("warn", "disk low", {"source": "agent"}), ("error", "bad", {"source": "agent"})]
