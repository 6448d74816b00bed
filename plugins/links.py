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


class DataDocsLink(BaseOperatorLink):
    """The Data Docs of the task's validation (passed or failed), else their index."""

    name = "Great Expectations Data Docs"

    def get_link(self, operator, *, ti_key) -> str:
        docs = getattr(operator, "_data_docs", None)
        from wavepipe.pages import site_path

        path = site_path(docs[1] or "") if docs else None
        return app_url(f"data-docs/{path}") if path else ""
