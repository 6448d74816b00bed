"""Paths, folders and globs to recordings, each file read by the reader of its kind.

``recordings`` never stops a batch for one file: a file that cannot be read gives its exception in
place of recordings, for the caller to report. The readers (obspy, soundfile, wfdb) are imported
only when a file of their kind is read.
"""

from __future__ import annotations

import glob
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from wavepipe.recordings import Recording, Skipped

Kind = Literal["seismic", "audio", "ecg"]
AUDIO_SUFFIXES = frozenset({".wav", ".flac", ".ogg", ".aiff", ".aif"})
WFDB_HEADER = ".hea"


def _has_wildcard(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _visible(path: Path, root: Path) -> bool:
    """Whether no part of ``path`` below ``root`` is hidden (starts with a dot)."""
    return not any(part.startswith(".") for part in path.relative_to(root).parts)


def _files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and _visible(p, folder)]


def _matches(pattern: str) -> list[Path]:
    """The files ``pattern`` names: a file, the files in a folder (recursively) or a glob's
    (``**`` across folders; hidden names are not matched)."""
    if not _has_wildcard(pattern):
        path = Path(pattern)
        return _files_under(path) if path.is_dir() else [path] if path.is_file() else []
    found = []
    for match in map(Path, glob.glob(pattern, recursive=True)):
        found.extend(_files_under(match) if match.is_dir() else [match] if match.is_file() else [])
    return found


def expand(paths: Iterable[str | Path]) -> list[Path]:
    """The files ``paths`` name (files, folders recursively, globs), sorted, each once, hidden
    files of folders and globs left out; ``FileNotFoundError`` for a path that names none."""
    found: set[Path] = set()
    for pattern in map(str, paths):
        matches = _matches(pattern)
        if not matches:
            raise FileNotFoundError(f"{pattern}: no such file, or nothing matches it")
        found.update(matches)
    return sorted(found)


def kind_of(path: str | Path) -> Kind:
    """Which reader reads ``path``, by its suffix: audio (``.wav .flac .ogg .aiff``), ECG (a
    WFDB header, ``.hea``), else seismic (obspy detects the format from the contents)."""
    suffix = Path(path).suffix.lower()
    if suffix in AUDIO_SUFFIXES:
        return "audio"
    return "ecg" if suffix == WFDB_HEADER else "seismic"


def _wfdb_members(folder: Path, cache: dict[Path, frozenset[str]]) -> frozenset[str]:
    """The names of the files the WFDB records in ``folder`` consist of (their signal files, as
    their headers name them, and ``<record>.*``), found once per folder."""
    if folder not in cache:
        names: set[str] = set()
        for header in folder.glob(f"*{WFDB_HEADER}"):
            names.update(word for word in header.read_text(errors="replace").split() if "." in word)
            names.update(p.name for p in folder.glob(f"{glob.escape(header.stem)}.*") if p != header)
        cache[folder] = frozenset(names)
    return cache[folder]


def _read(path: Path, kind: Kind, group_components: bool, start_ns: int | None) -> list[Recording | Skipped]:
    if kind == "audio":
        from wavepipe.recordings.audio import recordings_from_sound

        return list(recordings_from_sound(path, start_ns=start_ns))
    if kind == "ecg":
        from wavepipe.recordings.ecg import recordings_from_wfdb

        return list(recordings_from_wfdb(path, start_ns=start_ns))
    from wavepipe.recordings.seismic import recordings_from_obspy

    return list(recordings_from_obspy(path, group_components=group_components))


def recordings(
    paths: Iterable[str | Path], *, group_components: bool = False, start_ns: int | None = None
) -> Iterator[tuple[Path, Recording | Skipped | Exception]]:
    """Each file of ``expand(paths)`` with each of its recordings and ``Skipped`` parts, or with
    the exception that reading it raised (a missing extra's ``MissingExtraError`` too): one file's failure never
    stops the others. A file of a WFDB record other than its header (``.dat``, annotations) is
    read with its record, not alone. ``group_components``: seismic files' aligned components as
    one recording; ``start_ns``: the start of audio files and of WFDB records without a base date.
    A path that names no file raises ``FileNotFoundError`` before any file is read."""
    wfdb_cache: dict[Path, frozenset[str]] = {}
    for path in expand(paths):
        kind = kind_of(path)
        if kind != "ecg" and path.name in _wfdb_members(path.parent, wfdb_cache):
            continue
        try:
            found = _read(path, kind, group_components, start_ns)
        except Exception as exc:  # reported per file by the caller; the batch goes on
            yield path, exc
            continue
        for recording in found:
            yield path, recording
