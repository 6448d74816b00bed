"""Data Docs with no network: every CDN file GX's installed templates load has a shipped copy."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import great_expectations
import pytest

from wavepipe.offline_docs import (
    GX_IMAGES,
    LOCAL_COPIES,
    SITE_FOLDER,
    install_assets,
    localize,
    localize_site,
    remote_urls,
)

TEMPLATES = Path(great_expectations.__file__).parent / "render" / "view" / "templates"


def test_every_cdn_file_of_the_installed_gx_templates_is_shipped_or_dropped():
    texts = {p.name: p.read_text() for p in TEMPLATES.glob("*.j2")}
    loaded = {url for text in texts.values() for url in remote_urls(text)}
    assert loaded, "GX's templates load nothing from a CDN any more: wavepipe.offline_docs may go"
    unknown = loaded - set(LOCAL_COPIES)
    assert not unknown, f"GX's templates load files wavepipe does not ship (make data-docs-assets): {unknown}"
    for name, text in texts.items():
        assert remote_urls(localize(text, "static/wavepipe")) == [], name
    # the navigation bar's logo is a remote image too (set as a prefix there, not a tag)
    assert f'static_images_dir = "{GX_IMAGES}"' in texts["top_navbar.j2"]


def test_each_shipped_copy_exists():
    shipped = resources.files("wavepipe") / "resources" / "data_docs"
    for local in set(LOCAL_COPIES.values()) - {None}:
        assert (shipped / local).is_file(), local
    css = (shipped / "css" / "fontawesome.min.css").read_text()
    for font in set(re.findall(r"url\(\.\./webfonts/([^)]+\.woff2)\)", css)):
        assert (shipped / "webfonts" / font).is_file(), font


def test_a_page_loads_the_copies_without_integrity_or_crossorigin():
    html = (
        '<head><link rel="stylesheet" href="https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css"/>\n'
        '<link rel="stylesheet" href="https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/'
        'bootstrap-prefers-dark.css" />\n'
        '<script src="https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js" '
        'integrity="sha384-x" crossorigin="anonymous"></script>\n'
        '<script src="https://example.org/other.js"></script><a href="https://greatexpectations.io">GX</a></head>'
    )
    html += (
        '<img\n  src="https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/logo-long.png?d=1&dataContextId=x"'
        '\n  alt="Great Expectations">'
    )
    out = localize(html, "../../static/wavepipe")
    assert '<link rel="stylesheet" href="../../static/wavepipe/bootstrap.min.css"/>' in out
    assert 'src="../../static/wavepipe/../images/logo-long.png"\n  alt="Great Expectations">' in out
    assert "dataContextId" not in out
    assert '<script src="../../static/wavepipe/popper.min.js"></script>' in out
    assert "bootstrap-prefers-dark" not in out and "integrity" not in out and "crossorigin" not in out
    # what it does not know stays, for remote_urls to name; a plain link is no load
    assert remote_urls(out) == ["https://example.org/other.js"]
    assert '<a href="https://greatexpectations.io">' in out


def test_localize_site_rewrites_the_pages_it_is_given_and_the_suites_with_paths_relative_to_each(tmp_path: Path):
    url = "https://code.jquery.com/jquery-3.7.1.min.js"
    index, deep = tmp_path / "index.html", tmp_path / "validations/s/r/t/b.html"
    suite, old = tmp_path / "expectations/s.html", tmp_path / "validations/s/r/t/old.html"
    for page in (index, deep, suite, old):
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(f'<script src="{url}"></script>')
    assert localize_site(tmp_path, [index, deep, tmp_path / "gone.html"]) == 3
    assert f'src="{SITE_FOLDER}/jquery.min.js"' in index.read_text()
    assert f'src="../../../../{SITE_FOLDER}/jquery.min.js"' in deep.read_text()
    assert f'src="../{SITE_FOLDER}/jquery.min.js"' in suite.read_text()
    assert url in old.read_text()  # an earlier build's: not read again
    assert (tmp_path / SITE_FOLDER / "webfonts" / "fa-solid-900.woff2").is_file()
    assert localize_site(tmp_path, [index, deep]) == 0  # idempotent


@pytest.mark.parametrize("damaged", ["missing", "truncated"])
def test_install_assets_replaces_a_missing_or_damaged_copy(tmp_path: Path, damaged: str):
    target = install_assets(tmp_path)
    copy = target / "jquery.min.js"
    if damaged == "missing":
        copy.unlink()
    else:
        copy.write_text("x")
    install_assets(tmp_path)
    assert copy.stat().st_size == (resources.files("wavepipe") / "resources/data_docs/jquery.min.js").stat().st_size
