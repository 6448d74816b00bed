"""Great Expectations Data Docs that render with no network.

GX's page templates load Bootstrap, jQuery, bootstrap-table (which fills the index's table),
Font Awesome and Vega from CDNs, so on a machine without internet the pages come unstyled and the
index empty. wavepipe ships those files (``resources/data_docs``, fetched from the npm registry by
``make data-docs-assets``; licenses beside them) and points each built page at a copy in the
site's ``static/wavepipe/`` folder. The dark-mode stylesheet (bootstrap-prefers-dark, 0.9 MB)
is left out: its link is removed and pages stay light. A site the API server serves from the run
state (``wavepipe.pages``) gets these files, and GX's images, from the installed packages (``asset``).

The pages also lose what GX adds for its own sake (``tidy``): the newsletter footer fixed over the
bottom of every page, the index's "check out one of these tutorials" banner and the results
pages' walkthrough script; and a results page built without a data asset name says what its suite
ran on instead of "Data asset: None".
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from importlib import resources
from pathlib import Path

#: Where the shipped files go inside a Data Docs site.
SITE_FOLDER = "static/wavepipe"

#: Each CDN file GX's templates load -> the shipped copy (None: the link is dropped).
LOCAL_COPIES: dict[str, str | None] = {
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": "bootstrap.min.css",
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": "bootstrap.min.js",
    "https://code.jquery.com/jquery-3.7.1.min.js": "jquery.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": "popper.min.js",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css": "bootstrap-table.min.css",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js": "bootstrap-table.min.js",
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css": (
        "bootstrap-table-filter-control.min.css"
    ),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css": (
        "bootstrap-table-filter-control.min.css"
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js": (
        "bootstrap-table-filter-control.min.js"
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css": (
        "bootstrap-datepicker.min.css"
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js": (
        "bootstrap-datepicker.min.js"
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css": "css/fontawesome.min.css",
    "https://cdn.jsdelivr.net/npm/vega@5": "vega.min.js",
    "https://cdn.jsdelivr.net/npm/vega-lite@5": "vega-lite.min.js",
    "https://cdn.jsdelivr.net/npm/vega-embed@6": "vega-embed.min.js",
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css": None,
}

#: GX's logo in the pages' navigation bar comes from here, with the project's id in its query (a
#: beacon); the site's own ``static/images`` has the same images.
GX_IMAGES = "https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/"

#: An opening <script>, <link> or <img> tag that loads a file from the network.
_REMOTE_TAG = re.compile(r"<(?:script|link|img)\b[^>]*?\b(?:src|href)=\"(https?://[^\"]+)\"[^>]*>", re.IGNORECASE)
_CORS = re.compile(r"\s+(?:integrity|crossorigin)=\"[^\"]*\"", re.IGNORECASE)

#: A <footer> or an inline <script>, whole.
_FOOTER = re.compile(r"<footer\b[^>]*>.*?</footer>\s*", re.IGNORECASE | re.DOTALL)
_INLINE_SCRIPT = re.compile(r"<script>(?:(?!</script>).)*</script>\s*", re.IGNORECASE | re.DOTALL)
#: What marks GX's own additions: the newsletter footer, the tutorials banner (``ge-cta-footer``)
#: and its script, the walkthrough modal's script.
_GX_OWN = ("greatexpectations.io/newsletter", "ge-cta-footer", "ge-walkthrough-modal")
#: A results page's data asset when GX knew none.
_NO_ASSET = re.compile(r"Data asset: None(<br>)?")
#: A results page's file name: ``<data source>-<suite>.html``.
_RESULTS_PAGE = re.compile(r"[^-/]+-(?P<suite>[^/]+)\.html")


def _local_copy(url: str) -> tuple[bool, str | None]:
    """(known, the copy's path under ``SITE_FOLDER`` or None to drop the tag) for a remote URL."""
    if url.startswith(GX_IMAGES):
        return True, "../images/" + url.removeprefix(GX_IMAGES).split("?", 1)[0]
    return url in LOCAL_COPIES, LOCAL_COPIES.get(url)


def localize(html: str, prefix: str) -> str:
    """``html`` with every CDN file of ``LOCAL_COPIES`` (and GX's logo) loaded from ``prefix``
    (the path from the page to the site's ``SITE_FOLDER``) instead, its ``integrity`` and
    ``crossorigin`` left out (a browser refuses a crossorigin load from ``file://``). A tag whose
    URL is not known is kept as it is: ``remote_urls`` finds it."""
    out, last = [], 0
    for match in _REMOTE_TAG.finditer(html):
        known, local = _local_copy(match.group(1))
        if not known:
            continue
        out.append(html[last : match.start()])
        last = match.end()
        if local is not None:  # else dropped: a <link> has no closing tag to remove
            tag = match.group(0).replace(match.group(1), f"{prefix}/{local}")
            out.append(_CORS.sub("", tag))
    out.append(html[last:])
    return "".join(out)


def tidy(html: str, page: str = "") -> str:
    """``html`` without GX's newsletter footer, its tutorials banner (and the script that shows
    it) and its walkthrough script; "Data asset: None" in a results page (file name ``page``:
    ``<data source>-<suite>.html``) says what the suite ran on (``expectations.ASSETS``), or goes."""
    from wavepipe.expectations import ASSETS, suite_base

    def own(match: re.Match) -> str:
        return "" if any(mark in match.group(0) for mark in _GX_OWN) else match.group(0)

    html = _INLINE_SCRIPT.sub(own, _FOOTER.sub(own, html))
    if _NO_ASSET.search(html):
        named = _RESULTS_PAGE.fullmatch(page.rpartition("/")[2])
        asset = ASSETS.get(suite_base(named["suite"])) if named else None
        html = _NO_ASSET.sub(lambda m: f"Data asset: {asset}{m.group(1) or ''}" if asset else "", html)
    return html


def remote_urls(html: str) -> list[str]:
    """The files ``html`` still loads from the network (scripts, stylesheets, images)."""
    return [m.group(1) for m in _REMOTE_TAG.finditer(html)]


def shipped_dir() -> Path:
    """The shipped files, in the installed package."""
    return Path(str(resources.files("wavepipe").joinpath("resources", "data_docs")))


def gx_static_dir() -> Path:
    """GX's own files that it copies into a site's ``static/`` (its images and fonts), in the
    installed package (found without importing GX)."""
    (package,) = importlib.util.find_spec("great_expectations").submodule_search_locations
    return Path(package) / "render" / "view" / "static"


def asset(path: str) -> tuple[Path, str] | None:
    """Where the file at ``path`` in a Data Docs site is in the installed packages, as (a folder,
    the path in it), for what the pages load from the site's ``static/``: the shipped copies
    (``SITE_FOLDER``) and GX's images; None for any other path (a page)."""
    if path.startswith(f"{SITE_FOLDER}/"):
        return shipped_dir(), path.removeprefix(f"{SITE_FOLDER}/")
    if path.startswith("static/"):
        return gx_static_dir(), path.removeprefix("static/")
    return None


def install_assets(site: Path) -> Path:
    """Copy the shipped files into ``site``'s ``SITE_FOLDER`` (only those missing or changed)."""
    target = site / SITE_FOLDER
    source = shipped_dir()
    for path in source.rglob("*"):
        if path.is_file():
            dest = target / path.relative_to(source)
            if not dest.exists() or dest.stat().st_size != path.stat().st_size:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, dest)
    return target


def localize_site(site: Path, pages: list[Path]) -> int:
    """Install the shipped files into the Data Docs ``site``, localize and ``tidy`` ``pages`` (the
    pages one build wrote: its results, the index) and the suites' pages; returns how many
    changed. Only these are read: a site keeps every result page ever built."""
    target = install_assets(site)
    changed = 0
    for page in {*pages, *(site / "expectations").rglob("*.html")}:
        if not page.is_file():
            continue
        html = page.read_text(encoding="utf-8")
        new = tidy(localize(html, Path(os.path.relpath(target, page.parent)).as_posix()), page.name)
        if new != html:
            page.write_text(new, encoding="utf-8")
            changed += 1
    return changed
