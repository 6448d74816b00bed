"""The contracts every room imports: settings, the chunk protocol, run plans, the run report and
where a run's files live. Nothing here starts a service, talks to Kafka or Spark, or parses a
command line."""
