"""Checks a node before `gmount up` starts anything there; runs on the node as `python - PARAMS`.

It must run on any Python 3 the node may have, so that an old or wrong interpreter gets a
clear message instead of a traceback: no f-strings, no annotations (types are comments), and
only the standard library -- gmountpy itself is located, not imported (networkx alone takes a
while to import). PARAMS is JSON: {"requires": [modules the daemon imports], "nodes":
[{"name", "export", "create_export", "mountpoint", "listen", "port"}]}. The answer is one
line on stdout: "GMOUNT PREFLIGHT " + JSON {"python", "executable", "version" or
"import_error", "fuse" (a problem or null), "nodes": {name: [problems]}}.
"""

import errno
import importlib.util
import json
import os
import socket
import sys

MARKER = "GMOUNT PREFLIGHT "


def locate_gmountpy(requires):  # type: (list[str]) -> dict[str, str]
    """{"version": ...} of the gmountpy this interpreter would import, or {"import_error": why not}."""
    try:
        found = importlib.util.find_spec("gmountpy")
        if found is None or not found.origin:
            return {"import_error": "ModuleNotFoundError: No module named 'gmountpy'"}
        scope = {}  # type: dict[str, object]
        with open(os.path.join(os.path.dirname(found.origin), "_version.py")) as f:
            exec(f.read(), scope)
        answer = {"version": str(scope.get("__version__", "unknown"))}
        missing = [m for m in requires if importlib.util.find_spec(m) is None]
        if missing:
            answer["import_error"] = "gmountpy is there but not %s" % ", ".join(missing)
        return answer
    except Exception as e:
        return {"import_error": "%s: %s" % (type(e).__name__, e)}


def fuse_problem():  # type: () -> str | None
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (FUSE module not loaded, or a container without the device)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as e:
        return "/dev/fuse cannot be opened by this user (%s)" % e.strerror
    dirs = os.environ.get("PATH", "").split(os.pathsep) + ["/usr/bin", "/bin", "/usr/local/bin"]
    for d in dirs:
        if d and os.access(os.path.join(d, "fusermount3"), os.X_OK):
            return None
    return "fusermount3 is not installed (Debian/Ubuntu package fuse3)"


def unescape(field):  # type: (str) -> str
    """A mount point as /proc/self/mounts spells it, back to the path."""
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mounted():  # type: () -> set[str]
    try:
        with open("/proc/self/mounts") as f:
            return {unescape(line.split(" ")[1]) for line in f if line.count(" ") >= 2}
    except OSError:
        return set()


def creatable(path):  # type: (str) -> str | None
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return "%s is not a directory" % parent
    if not os.access(parent, os.W_OK | os.X_OK):
        return "%s is not writable by this user" % parent
    return None


def check_export(path, create):  # type: (str, bool) -> str | None
    if os.path.exists(path):
        if not os.path.isdir(path):
            return "export %s is not a directory" % path
        if not os.access(path, os.R_OK | os.X_OK):
            return "export %s is not readable by this user" % path
        return None
    if not create:
        return ("export %s does not exist: create it, fix `export` in the cluster file, "
                "or set create_export = true to have it made" % path)
    why = creatable(path)
    return why and "export %s does not exist and cannot be created (%s)" % (path, why)


def check_mountpoint(path, mounts):  # type: (str, set[str]) -> str | None
    if path in mounts:
        return ("mountpoint %s is already mounted: run `gmount down` for the cluster using it, "
                "or `fusermount3 -u %s`" % (path, path))
    try:
        entries = os.listdir(path)
    except OSError as e:
        if e.errno == errno.ENOENT:
            why = creatable(path)
            return why and "mountpoint %s does not exist and cannot be created (%s)" % (path, why)
        if e.errno == errno.ENOTCONN:
            return "mountpoint %s is a stale mount: run `fusermount3 -u -z %s`" % (path, path)
        if e.errno == errno.ENOTDIR:
            return "mountpoint %s is not a directory" % path
        return "mountpoint %s is not usable (%s)" % (path, e.strerror)
    if entries:
        return "mountpoint %s is not empty: choose an empty directory" % path
    if not os.access(path, os.W_OK | os.X_OK) and not sealed(path):
        return "mountpoint %s is not writable by this user (FUSE needs that to mount on it)" % path
    return None


def sealed(path):  # type: (str) -> bool
    # left unwritable under a mount by a daemon that died (gmountpy.node.directories.MODE_XATTR):
    # the next daemon unseals it to mount
    try:
        os.getxattr(path, "user.gmount.mountpoint_mode")
        return True
    except (OSError, AttributeError):
        return False


def check_listen(host, port):  # type: (str, int) -> str | None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(1)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return ("port %d on %s is in use by another program: choose another port, "
                    "or port = 0 for any free one" % (port, host))
        if e.errno == errno.EADDRNOTAVAIL:
            return "listen address %s is not an address of this host: fix listen" % host
        if e.errno == errno.EACCES:
            return "port %d needs privileges this user lacks: choose a port above 1023" % port
        return "cannot listen on %s:%d (%s)" % (host, port, e.strerror)
    finally:
        s.close()
    return None


def report(requires, nodes):  # type: (list[str], list[dict[str, object]]) -> dict[str, object]
    """Everything the launcher asks about this node, for each of `nodes` (see the module doc)."""
    answer = {"python": "%d.%d.%d" % tuple(sys.version_info[:3]), "executable": sys.executable,
              "fuse": fuse_problem()}  # type: dict[str, object]
    answer.update(locate_gmountpy(requires))
    mounts = mounted()
    problems = {}  # type: dict[str, list[str]]
    for n in nodes:
        found = (check_export(str(n["export"]), bool(n["create_export"])),
                 check_mountpoint(str(n["mountpoint"]), mounts), check_listen(str(n["listen"]), int(str(n["port"]))))
        problems[str(n["name"])] = [p for p in found if p]
    answer["nodes"] = problems
    return answer


if __name__ == "__main__":
    PARAMS = json.loads(sys.argv[1])
    sys.stdout.write(MARKER + json.dumps(report(PARAMS["requires"], PARAMS["nodes"])) + "\n")
