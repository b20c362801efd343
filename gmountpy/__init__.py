"""gmountpy: one locality-aware namespace over the local disks of machines you can SSH into."""

from ._version import __version__
from .config import ClusterSpec, SpecError, load_spec
from .errors import GmountError
from .overlay import Overlay

__all__ = ["ClusterSpec", "GmountError", "Overlay", "SpecError", "__version__", "load_spec"]
