"""The API server's run pages app (pure parts): what it serves and how a page's links are read."""

from __future__ import annotations

import pytest
from fastapi import HTTPException

from wavepipe.plugins.report_app import inside, served_page


def test_only_files_inside_the_folder_are_served(tmp_path):
    (tmp_path / "site" / "validations").mkdir(parents=True)
    (tmp_path / "site" / "validations" / "r.html").write_text("results")
    (tmp_path / "secret").write_text("no")
    (tmp_path / "site" / "out").symlink_to(tmp_path / "secret")
    assert inside(tmp_path / "site", "validations/r.html").read_text() == "results"
    for bad in ("../secret", "out", "/etc/passwd", "validations", "missing.html"):
        with pytest.raises(HTTPException) as raised:
            inside(tmp_path / "site", bad)
        assert raised.value.status_code == 404


def test_a_pages_data_docs_links_point_at_the_app(tmp_path):
    root = tmp_path / "gx" / "uncommitted" / "data_docs" / "local_site"
    html = f'<a href="file://{root}/index.html">Data Docs</a> <a href="other.json">JSON</a>'
    assert served_page(html, root, "/base/wavepipe") == (
        '<a href="/base/wavepipe/data-docs/index.html">Data Docs</a> <a href="other.json">JSON</a>'
    )
