"""`gmountpy.pegasus`: the documented name of the Pegasus plugin (gmountpy_pegasus, extra `gmountpy[pegasus]`).

A leaf alias: no gmountpy module imports it; the plugin imports only
gmountpy's public API, so imports still flow plugin -> core.
"""

from gmountpy_pegasus import *  # noqa: F403
