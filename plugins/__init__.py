"""Airflow operators and hooks that wrap the wavepipe library (the DAG files only wire them)."""
