"""The services wavepipe runs on this machine for local use and tests: a KRaft Kafka broker (or
cluster), a Spark Connect server, a Spark standalone cluster and Airflow's services; the Maven
jars they need and the processes they leave. A deployment points wavepipe at its own services instead."""
