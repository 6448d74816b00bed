"""wavepipe: bounded, exactly-once batch runs that turn chunked waveforms on Kafka into checked
Delta Lake tables. Its release is the one in pyproject.toml, read from the installed metadata."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("wavepipe")
except PackageNotFoundError:  # the source tree on sys.path without an install
    __version__ = "0+unknown"
