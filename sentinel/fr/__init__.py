"""Flight-recorder analysis (`sentinel fr analyze`): torch-free, reads PyTorch's dump files."""

from sentinel.fr.analyze import Report, analyze
from sentinel.fr.dumps import DumpError, load_dir

__all__ = ["DumpError", "Report", "analyze", "load_dir"]
