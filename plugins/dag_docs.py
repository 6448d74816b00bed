"""The ``doc_md`` of wavepipe's DAGs and tasks: what the Airflow UI shows on a DAG's and a task's
page (Markdown). The docs/ folder has the whole story; these say what a run does and where to look.
"""

INGEST = """\
### wavepipe ingest: a bounded run of chunked waveforms

Each run reads **frozen offset ranges** of its consumer group on the topic (the plan), stages the
chunks, reassembles each waveform by key and sequence on the Spark engine, validates the result
with Great Expectations, publishes it into the Delta tables in one commit per table, and only then
commits the offsets to Kafka.

* **Trigger** with conf to override the params (a key that is no param is refused). An
  incremental run continues from the group's committed offsets; a *backfill* reprocesses its
  windows and replaces their output, committing no offsets.
* **Retries are safe**: every step resumes its run; nothing is published or committed twice.
* **A failed validation** publishes nothing and commits nothing; the task log names the failed
  expectations and links the run's report page. Clear the task after fixing the data or the
  thresholds.
* **Outputs**: the tables `waveforms`, `quarantine`, `dead_letter` are assets: a DAG scheduled on
  one runs after each run that put rows in it (the event's extra: run id, rows, table version).
* `wavepipe status` lists the runs; `wavepipe rewind` (or the rewind DAG) moves the group.
"""

REWIND = """\
### wavepipe rewind: move a consumer group's offsets

A **dry run** unless `execute` is on: the task log shows, per partition, where the group is and
where it would go. With `execute` (and a `reason`), the move is applied and audited; the next
ingest run reads from there. `force` accepts a target outside what the topic retains, clamped to
it. A group with a run in progress is refused: let it finish first.
"""

MAINTENANCE = """\
### wavepipe maintenance: keep the output tables fast to read

`optimize` compacts the date partitions that hold more than one file (and, with `zorder`, sorts
the waveforms by source and start time); `vacuum` then deletes files no version newer than the
retention uses. Each waits for a run's Spark step that holds the tables; runs wait meanwhile.
"""

TASKS = {
    "plan": "Freeze the run's offset ranges per partition (reused on a retry); its output: the "
    "partition groups the mapped `consume` tasks read.",
    "consume": "Read this group of partitions' planned ranges from Kafka and stage their chunks "
    "(overwritten on a retry).",
    "reassemble": "Reassemble each waveform by key and sequence on the Spark engine into the "
    "run's private candidate tables (nothing published yet).",
    "validate": "Run the expectation suites on the candidates; publish them into the Delta tables "
    "only if every one holds. A failure is not retried: fix, then clear this task.",
    "commit": "Check the accounting, commit the safe offsets to Kafka, write the run report, and "
    "emit an asset event for each table the run put rows in.",
    "run": "The whole run in one task: plan, consume, reassemble, validate and publish, commit "
    "(a retry resumes at its first unfinished step).",
    "follow": "Micro-batches back to back for the DAG's follow time: a run (plan to commit, with "
    "its report and asset events) each time the group lags.",
    "rewind": "Show (dry run) or apply a move of the group's offsets, audited.",
    "optimize": "Compact the tables' partitions that hold more than one file.",
    "vacuum": "Delete the table files no recent version uses (after the retention).",
}
