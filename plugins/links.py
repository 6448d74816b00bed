"""A wavepipe task's extra links (the buttons on its page in the Airflow UI): its run's page and
the Great Expectations Data Docs of its validation, served by the API server from the run state
(``wavepipe.plugins.report_app``). Airflow asks for them in the worker once the task ends and
keeps them; a task with nothing to show gets no link."""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import BaseOperatorLink

from wavepipe.plugins.report_app import PREFIX


def app_url(path: str) -> str:
    """``path`` under the app, at the API server's base URL (``[api] base_url``)."""
    from airflow.sdk import conf

    base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    return f"{base}{PREFIX}/{path}"


class RunPageLink(BaseOperatorLink):
    """The page of the run the task committed (the last, for a follow task)."""

    name = "wavepipe run page"

    def get_link(self, operator, *, ti_key) -> str:
        committed = getattr(operator, "_committed", None)
        page = committed[1][-1].get("report_html") if committed else None
        return app_url(f"reports/{Path(page).name}") if page else ""


def results_page(report: dict | None) -> str | None:
    """The Data Docs page of a run ``report``'s own validation results: its first failed suite's,
    else its first suite's (the per-waveform results, which link the run-level ones and the
    index); None when the report links none."""
    suites = [s for s in ((report or {}).get("validation") or {}).get("suites") or () if s.get("data_docs")]
    failed = [s for s in suites if not s.get("success")]
    return (failed or suites)[0]["data_docs"] if suites else None


class DataDocsLink(BaseOperatorLink):
    """The Data Docs results of the run the task committed (the last, for a follow task), else
    those its validation recorded (failed: its failed suite's; passed: their index)."""

    name = "Great Expectations Data Docs"

    def get_link(self, operator, *, ti_key) -> str:
        from wavepipe.pages import site_path

        committed = getattr(operator, "_committed", None)
        docs = getattr(operator, "_data_docs", None)
        page = (results_page(committed[1][-1]) if committed else None) or (docs[1] if docs else None)
        path = site_path(page or "")
        return app_url(f"data-docs/{path}") if path else ""
