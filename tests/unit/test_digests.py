"""The readers' in-order digests: a waveform hashed once, as its chunks are staged."""

import pyarrow as pa

from tests.helpers import waveform_records, with_headers
from wavepipe.consumers.staging import DIGEST_SCHEMA, InOrderDigests
from wavepipe.contracts.protocol import checksum, output_facts, parse_chunk


def _feed(digests: InOrderDigests, records, first_offset: int = 0) -> list[dict]:
    rows = []
    for i, (_, headers, value) in enumerate(records):
        row = digests.add(parse_chunk(headers, value), first_offset + i)
        if row is not None:
            rows.append(row)
    return rows


def test_interleaved_in_order_waveforms_each_get_the_sha256_of_their_joined_chunks():
    a, a_sum = waveform_records("a", 3, seed=1)
    b, b_sum = waveform_records("b", 2, seed=2)
    one, one_sum = waveform_records("one", 1, seed=3)
    rows = _feed(InOrderDigests("t", 4), [a[0], b[0], a[1], one[0], b[1], a[2]], first_offset=100)
    assert [(r["waveform_id"], r["digest"], r["checksum"]) for r in rows] == [
        ("one", one_sum, one_sum),
        ("b", b_sum, b_sum),
        ("a", a_sum, a_sum),
    ]
    by_id = {r["waveform_id"]: r for r in rows}
    assert (by_id["a"]["partition"], by_id["a"]["first_offset"], by_id["a"]["last_offset"], by_id["a"]["n_chunks"]) == (
        4,
        100,
        105,
        3,
    )
    chunk = parse_chunk(a[0][1], a[0][2])
    facts = {
        "waveform_id": "a",
        "source": chunk.meta.source,
        "dtype": chunk.meta.dtype,
        "channels": chunk.meta.channels,
        "sample_rate": chunk.meta.sample_rate,
        "start_ns": chunk.meta.start_ns,
        "checksum": a_sum,
        "topic": "t",
        "extension": None,
    }
    size = sum(len(v) for _, _, v in a)
    assert by_id["a"] == {**output_facts(facts, size, 3, 4, 100, 105), "digest": a_sum}
    pa.Table.from_pylist(rows, schema=DIGEST_SCHEMA)  # the rows fit the staged file's schema


def test_a_corrupt_chunk_gives_a_digest_that_differs_from_the_checksum():
    a, a_sum = waveform_records("a", 3, seed=1)
    key, headers, value = a[1]
    (row,) = _feed(InOrderDigests("t", 0), [a[0], (key, headers, bytes(len(value))), a[2]])
    assert row["checksum"] == a_sum and row["digest"] != a_sum
    assert row["digest"] == checksum(a[0][2] + bytes(len(value)) + a[2][2])


def test_out_of_order_repeated_or_mixed_chunks_get_no_digest():
    a, _ = waveform_records("a", 3, seed=1)
    b, _ = waveform_records("b", 3, seed=2)
    other, _ = waveform_records("b", 3, seed=9)  # another content under b's id
    c, c_sum = waveform_records("c", 2, seed=3)
    d, _ = waveform_records("d", 2, seed=4)
    records = [
        a[1],
        a[0],
        a[2],  # out of order
        b[0],
        other[1],
        b[1],
        b[2],  # a chunk of another content in between
        c[0],
        c[0],
        c[1],  # a repeated chunk: seq 0 starts over, so c still completes
        d[0],
        with_headers(d, 1, **{"wp-count": b"3"}),
    ]  # chunks disagree on wp-count
    rows = _feed(InOrderDigests("t", 0), records)
    assert [(r["waveform_id"], r["digest"]) for r in rows] == [("c", c_sum)]


def test_at_most_max_open_waveforms_are_hashed_at_once():
    digests = InOrderDigests("t", 0, max_open=2)
    waveforms = [waveform_records(w, 2, seed=i) for i, w in enumerate("abc")]
    for i, (records, _) in enumerate(waveforms):
        assert digests.add(parse_chunk(records[0][1], records[0][2]), i) is None
    done = [digests.add(parse_chunk(records[1][1], records[1][2]), 10 + i) for i, (records, _) in enumerate(waveforms)]
    assert [r and r["waveform_id"] for r in done] == [None, "b", "c"], "the oldest (a) was dropped"
