"""Bad input on the real broker and a real Spark: every record ends in exactly one place, with a
reason where it is not an output waveform, and nothing stops the run."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer, TopicPartition
from markupsafe import escape

from tests.helpers import (
    START,
    assert_accounted,
    assert_delta_rs_reads_as_spark,
    output_rows,
    produce_in_order,
    published_tables,
    quarantine_reasons,
    read_topic,
    run_cli,
    waveform_records,
    with_headers,
)
from wavepipe import pipeline, storage
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic, group_consumer
from wavepipe.contracts.runfiles import html_path
from wavepipe.faults import InjectedFault

pytestmark = pytest.mark.integration


def assert_the_page_names_what_was_set_aside(settings, run_id: str) -> str:
    """Run ``run_id``'s page names each waveform the run put in the quarantine table (id, source,
    reason, detail, first offset) and each record it put in the dead-letter table (offset,
    reason, detail, and the id and source its headers carry), as the tables hold them (read by
    delta-rs). Returns the page's section that names them."""
    page = html_path(settings, run_id).read_text()
    section = page[page.index('id="set-aside"') : page.index("<h2>Offsets and chunks</h2>")]
    rows = {
        name: [r for r in storage.delta_table(path).to_pyarrow_table().to_pylist() if r["run_id"] == run_id]
        if storage.has_table(path)
        else []
        for name, path in (("quarantine", settings.quarantine_table), ("dead_letter", settings.dead_letter_table))
    }
    for r in rows["quarantine"]:
        row = section[section.index(f"<code>{_escaped(r['waveform_id'])}</code>") :].split("</tr>", 1)[0]
        for text in (r["source"], r["reason"], r["detail"]):
            assert f">{_escaped(text or '') or '–'}<" in row, (text, row)
        assert f'data-value="{r["first_offset"]}"' in row, row
    for r in rows["dead_letter"]:
        row = section[section.index(f'data-value="{r["offset"]}"') :].split("</tr>", 1)[0]
        for text in (r["reason"], r["detail"]):
            assert f">{_escaped(text or '') or '–'}<" in row, (text, row)
        sent = {h["key"]: h["value"].decode() for h in r["headers"] or []}
        if "wp-id" in sent:
            assert f"<code>{_escaped(sent['wp-id'])}</code>" in row, row
    assert f"Quarantined waveforms ({len(rows['quarantine'])})" in section or not rows["quarantine"]
    assert f"Dead-lettered records ({len(rows['dead_letter'])})" in section or not rows["dead_letter"]
    return section


def _escaped(text: str) -> str:
    """``text`` as the page's template writes it (Jinja's escaping)."""
    return str(escape(text))


def test_reordered_duplicated_interleaved_and_spread_chunks_each_land_once(settings, spark):
    ensure_topic(settings)
    rev, rev_sum = waveform_records("reversed", 4, seed=1)
    dup, dup_sum = waveform_records("retried", 3, seed=2)  # a producer retry without idempotence
    resent, resent_sum = waveform_records("resent-first", 3, seed=3)
    a, a_sum = waveform_records("inter-a", 3, seed=4)
    b, b_sum = waveform_records("inter-b", 3, seed=5)
    spread, spread_sum = waveform_records("spread", 4, seed=6)  # unkeyed, sticky batches
    produce_in_order(
        settings,
        [
            *rev[::-1],
            dup[0],
            dup[1],
            dup[1],
            dup[2],
            dup[2],
            resent[0],
            resent[1],
            resent[2],
            resent[0],
            a[0],
            b[0],
            a[1],
            b[1],
            b[2],
            a[2],
            spread[0],
            spread[1],
        ],
        partition=0,
    )
    produce_in_order(settings, [spread[2], spread[3]], partition=1)

    report = pipeline.run_once(settings)
    assert_accounted(spark, settings, report)
    assert report["waveforms"] == {"output_new": 6}
    p0, p1 = report["partitions"]["0"], report["partitions"]["1"]
    # duplicate copies are accounted with their waveform's output, not dropped silently
    assert (p0["output"], p0["pending"], p0["quarantined"], p0["dead_letter"], p0["safe_offset"]) == (21, 0, 0, 0, 21)
    assert (p1["output"], p1["safe_offset"]) == (2, 2)
    expected = {
        "reversed": rev_sum,
        "retried": dup_sum,
        "resent-first": resent_sum,
        "inter-a": a_sum,
        "inter-b": b_sum,
        "spread": spread_sum,
    }
    rows = output_rows(spark, settings)
    assert {r[0]: r[1] for r in rows} == expected
    assert all(r[1] == r[2] for r in rows), "payloads must be bit-exact"
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: 21, 1: 2}


def test_broken_waveforms_are_quarantined_and_junk_is_dead_lettered_with_reasons(settings, spark, monkeypatch):
    settings = settings.replace(dead_letter_topic=f"{settings.topic}-dlq")
    ensure_topic(settings, partitions=1)
    ensure_topic(settings, settings.dead_letter_topic, partitions=1)
    good, good_sum = waveform_records("good", 2, seed=6)
    corrupt, _ = waveform_records("corrupt", 2, seed=7)
    corrupt[1] = (corrupt[1][0], corrupt[1][1], bytes(len(corrupt[1][2])))  # payload zeroed
    short, _ = waveform_records("short", 2, seed=8)
    short[1] = (short[1][0], short[1][1], short[1][2][:-8])  # chunks hold fewer bytes than wp-size
    count, _ = waveform_records("count", 2, seed=9)
    count[1] = with_headers(count, 1, **{"wp-count": b"3"})  # chunks disagree on the chunk count
    meta, _ = waveform_records("meta", 2, seed=10)
    meta[1] = with_headers(meta, 1, **{"wp-sample-rate": b"250.0"})  # chunks disagree on metadata
    junk = [
        (b"k1", None, b"not a chunk"),  # no headers at all
        with_headers(good, 0, **{"wp-version": b"9"}),  # unknown protocol version
        with_headers(good, 0, **{"wp-seq": b"two"}),  # malformed header
        with_headers(good, 0, **{"wp-checksum": None}),  # missing header
        (good[0][0], good[0][1], b""),  # empty value
        with_headers(good, 0, **{"wp-sample-rate": b"nan"}),  # no number: refused before any arithmetic
    ]
    produce_in_order(settings, good + corrupt + short + count + meta + junk)

    # the commit dies right after its transaction (dead letters + offsets) went through ...
    monkeypatch.setenv("WAVEPIPE_FAILPOINTS", "commit.after_offsets=raise")
    with pytest.raises(InjectedFault):
        pipeline.run_once(settings, run_id="bad")
    monkeypatch.delenv("WAVEPIPE_FAILPOINTS")
    code, out = run_cli(settings, "abandon")  # its offsets went through: it must be finished, not dropped
    assert code == 1 and "already committed its offsets" in out, out[-2000:]
    report = pipeline.commit_step(settings, "bad")  # ... and its retry must not publish them again
    assert_accounted(spark, settings, report)
    p0 = report["partitions"]["0"]
    assert (p0["output"], p0["quarantined"], p0["dead_letter"], p0["pending"]) == (2, 8, 6, 0)
    assert p0["quarantine_reasons"] == {
        "checksum_mismatch": 2,
        "size_mismatch": 2,
        "chunk_count_mismatch": 2,
        "metadata_mismatch": 2,
    }
    assert p0["safe_offset"] == 16, "quarantined and dead-lettered records do not hold the commit back"
    assert [(r[0], r[1]) for r in output_rows(spark, settings)] == [("good", good_sum)]
    assert quarantine_reasons(spark, settings) == {
        "corrupt": "checksum_mismatch",
        "short": "size_mismatch",
        "count": "chunk_count_mismatch",
        "meta": "metadata_mismatch",
    }
    dead = sorted(
        (r["offset"], r["reason"], bytes(r["value"]))
        for r in spark.read.format("delta").load(str(settings.dead_letter_table)).collect()
    )
    assert dead == [
        (10, "missing_header", b"not a chunk"),
        (11, "unknown_version", good[0][2]),
        (12, "malformed_header", good[0][2]),
        (13, "missing_header", good[0][2]),
        (14, "empty_value", b""),
        (15, "malformed_header", good[0][2]),
    ]

    # the dead-letter topic got the same records, original bytes and headers, once
    published = read_topic(settings, settings.dead_letter_topic)
    assert [(h["wp-dlq-origin"], h["wp-dlq-reason"], v) for v, h in published] == [
        (f"{settings.topic}/0/{offset}".encode(), reason.encode(), value) for offset, reason, value in dead
    ]
    assert published[1][1]["wp-version"] == b"9" and published[1][1]["wp-id"] == b"good"

    # an independent reader (delta-rs, which Polars and most Python tools use) reads all three
    # tables row for row as Spark does: payloads, quarantine details and dead letters' raw bytes
    counts = {name: assert_delta_rs_reads_as_spark(spark, path) for name, path in published_tables(settings).items()}
    assert counts == {"waveforms": 1, "quarantine": 4, "dead_letter": 6, "qc": 1}

    # the run's page names each of them as the tables hold them, and the share they make
    section = assert_the_page_names_what_was_set_aside(settings, "bad")
    assert "<code>corrupt</code>" in section and "test-src" in section and "<code>good</code>" in section
    assert "4 of 5 waveforms quarantined (80%); the limit of" in section


def test_a_waveform_that_never_completes_is_pending_then_quarantined_as_incomplete(settings, spark):
    settings = settings.replace(incomplete_after_offsets=5, incomplete_after_s=0)
    ensure_topic(settings, partitions=1)
    lost, _ = waveform_records("never", 4, seed=1)
    x, _ = waveform_records("x", 2, seed=2)
    y, _ = waveform_records("y", 3, seed=3)
    produce_in_order(settings, [lost[0], lost[1], *x])  # offsets 0-3

    first = pipeline.run_once(settings, run_id="first")
    assert_accounted(spark, settings, first)
    assert first["waveforms"] == {"output_new": 1, "pending": 1}, "3 offsets past it: it can still complete"
    assert first["partitions"]["0"]["safe_offset"] == 0

    produce_in_order(settings, y)  # offsets 4-6: now 6 offsets passed its newest chunk, > 5
    second = pipeline.run_once(settings, run_id="second")
    assert_accounted(spark, settings, second)
    p0 = second["partitions"]["0"]
    assert second["waveforms"] == {"output_new": 1, "output_already_written": 1, "quarantined:incomplete": 1}
    assert (p0["quarantine_reasons"], p0["safe_offset"]) == ({"incomplete": 2}, 7), "it no longer holds the commit"
    assert quarantine_reasons(spark, settings) == {"never": "incomplete"}
    detail = spark.read.format("delta").load(str(settings.quarantine_table)).first()["detail"]
    assert detail.startswith("2 of 4 chunks; none in the last 6 offsets"), detail

    produce_in_order(settings, lost[2:])  # the rest turns up late: quarantined with it, not emitted
    third = pipeline.run_once(settings, run_id="third")
    assert_accounted(spark, settings, third)
    assert third["partitions"]["0"]["quarantine_reasons"] == {"incomplete": 2}

    rewind = group_consumer(settings, settings.group)  # reprocess all: now every chunk of it is read
    rewind.commit(offsets=[TopicPartition(settings.topic, 0, 0)], asynchronous=False)
    rewind.close()
    again = pipeline.run_once(settings, run_id="again")
    assert_accounted(spark, settings, again)
    assert again["waveforms"] == {"output_already_written": 2, "quarantined:incomplete": 1}, (
        "complete now, but quarantined once is quarantined for good"
    )
    assert again["partitions"]["0"]["quarantine_reasons"] == {"incomplete": 4}
    assert sorted(r[0] for r in output_rows(spark, settings)) == ["x", "y"]
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: 9}


def test_incomplete_by_record_time(settings, spark):
    settings = settings.replace(incomplete_after_offsets=0, incomplete_after_s=60)
    ensure_topic(settings, partitions=1)
    stuck, _ = waveform_records("stuck", 3, seed=1)
    later, later_sum = waveform_records("later", 2, seed=2)
    t0 = int(START.timestamp() * 1000)
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True}))
    for (key, headers, value), ts in [(stuck[0], t0), (later[0], t0 + 30_000), (later[1], t0 + 90_000)]:
        producer.produce(settings.topic, value=value, key=key, headers=headers, partition=0, timestamp=ts)
    assert producer.flush(30) == 0
    report = pipeline.run_once(settings)
    assert_accounted(spark, settings, report)
    assert report["waveforms"] == {"output_new": 1, "quarantined:incomplete": 1}
    assert report["partitions"]["0"]["safe_offset"] == 3
    assert [(r[0], r[1]) for r in output_rows(spark, settings)] == [("later", later_sum)]


def test_a_waveform_over_the_maximum_is_quarantined_before_it_is_whole(settings, spark):
    settings = settings.replace(max_waveform_bytes=1000)
    ensure_topic(settings, partitions=1)
    big, _ = waveform_records("big", 4, seed=1)  # 1024 bytes by its header
    small, small_sum = waveform_records("small", 3, seed=2)  # 768 bytes
    produce_in_order(settings, [big[0], big[1], *small])

    report = pipeline.run_once(settings)
    assert_accounted(spark, settings, report)
    # two of its four chunks are enough to know: quarantined now, never assembled, not pending
    assert report["waveforms"] == {"output_new": 1, "quarantined:too_large": 1}
    assert report["partitions"]["0"]["safe_offset"] == 5
    assert quarantine_reasons(spark, settings) == {"big": "too_large"}
    assert [(r[0], r[1]) for r in output_rows(spark, settings)] == [("small", small_sum)]
    section = assert_the_page_names_what_was_set_aside(settings, report["run_id"])
    assert "<code>big</code>" in section and "1024 bytes by header, 512 in chunks; the maximum is 1000" in section
    produce_in_order(settings, big[2:])
    rest = pipeline.run_once(settings)
    assert_accounted(spark, settings, rest)
    assert rest["partitions"]["0"]["quarantine_reasons"] == {"too_large": 2}
