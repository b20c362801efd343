import os
import sys

# Jobs' preload library must never ask this daemon about its own mount from inside it.
os.environ["GMOUNT_BYPASS"] = "0"

from .passthrough import preload  # noqa: E402  (before pyfuse3: it wraps fuse_session_mount)

preload()

from .daemon import main  # noqa: E402

sys.exit(main())
