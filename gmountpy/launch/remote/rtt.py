"""Times TCP connects to HOST PORT (one SYN/SYN-ACK round trip each) for `gmount probe`; runs on a node as
`python - HOST PORT COUNT`. Any Python 3, standard library only. The first connect is a warm-up. The answer
is one line: "GMOUNT RTT " + JSON {"ms": [milliseconds], "error": why it stopped, or null}.
"""

import json
import socket
import sys
import time

MARKER = "GMOUNT RTT "


def measure(host, port, count):  # type: (str, int, int) -> dict[str, object]
    times = []  # type: list[float]
    error = None
    for i in range(count + 1):
        start = time.perf_counter()
        try:
            s = socket.create_connection((host, port), timeout=5)
        except OSError as e:
            error = "%s:%d: %s" % (host, port, e)
            break
        elapsed = time.perf_counter() - start
        s.close()
        if i:
            times.append(elapsed * 1000.0)
        time.sleep(0.05)  # let the target's sshd deal with the last connection, off the clock
    return {"ms": times, "error": error}


if __name__ == "__main__":
    sys.stdout.write(MARKER + json.dumps(measure(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))) + "\n")
