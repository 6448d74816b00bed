"""``wavepipe bench``: wavepipe against the read ceiling and two alternatives, side by side.

One invocation produces a backlog per workload on the local broker, then runs on exactly the same
offset ranges: the ceiling (the tightest reader available, bytes written once to disk), wavepipe
end to end, a hand-written single-process Python consumer, and Spark's own Kafka batch source. It
records wall time, throughput and peak memory per process, repeats at a multiple of the backlog to
show how time and memory scale, and writes JSON, a markdown table and a chart.
"""
