"""Dead letters keep the original record exactly, and say where it came from and why."""

import json

from wavepipe.consumers.committer import dead_letter_record
from wavepipe.consumers.staging import dead_letter_row


def test_headers_are_kept_exactly_and_readably():
    row = dead_letter_row(
        "t", 3, 5, 1700, b"k", [("a", b"\xff\x00"), ("b", None)], b"v", "missing_header", "no wp-version"
    )
    assert row["headers"] == [{"key": "a", "value": b"\xff\x00"}, {"key": "b", "value": None}]
    assert json.loads(row["headers_json"]) == [["a", "\\xff\x00"], ["b", None]]


def test_the_published_record_is_the_original_plus_why():
    row = dead_letter_row("t", 3, 5, 1700, b"k", [("a", b"\xff\x00")], b"v", "missing_header", "no wp-version")
    key, value, headers = dead_letter_record(row)
    assert (key, value) == (b"k", b"v")
    assert headers == [
        ("a", b"\xff\x00"),
        ("wp-dlq-reason", b"missing_header"),
        ("wp-dlq-detail", b"no wp-version"),
        ("wp-dlq-origin", b"t/3/5"),
        ("wp-dlq-timestamp-ms", b"1700"),
    ]
