"""Placing jobs from the daemon's state (gmountpy.node.jobs) and its socket (gmountpy.cluster.jobsocket).

The placer runs on the in-process four-node harness (real namespaces, real RPC between nodes); the
socket server is served by trio on a real unix socket and asked by the standard-library client that
the Snakemake executor uses.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
import trio

from gmountpy.cluster import jobsocket
from gmountpy.jobs.placement import WAIT_FLOOR, choose_node
from gmountpy.node.jobs import JobPlacer, decode_request, encode_reply, prepare_directory, serve_jobs

from .._trio import trio_test
from .harness import open_cluster


def placer(cluster: object, me: str = "n1") -> JobPlacer:
    node = cluster[me]  # type: ignore[index]
    return JobPlacer(me, cluster.spec, cluster.overlay, node.namespace)  # type: ignore[attr-defined]


def mount(cluster: object, node: str) -> str:
    return cluster.spec.node(node).mountpoint  # type: ignore[attr-defined, no-any-return]


@trio_test
async def test_place_scores_inputs_as_the_placement_rule_does(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n1"].put("wf/a.txt", b"a" * 100)
        cluster["n3"].put("wf/b.txt", b"b" * 1000)
        cluster["n4"].put("wf/c.txt", b"c" * 600)
        cluster["n2"].put("wf/small.cfg", b"x")
        jobs = placer(cluster)
        cwd = f"{mount(cluster, 'n1')}/wf"
        reply = await jobs.place(cwd, ["a.txt", "b.txt", "c.txt", "small.cfg", "missing.txt"])
        holdings = {"/wf/a.txt": {"n1": 100}, "/wf/b.txt": {"n3": 1000}, "/wf/c.txt": {"n4": 600},
                    "/wf/small.cfg": {"n2": 1}, "/wf/missing.txt": {}}
        expected = choose_node(holdings, ["n1", "n2", "n3", "n4"], slots={n: 2 for n in holdings}, running={},
                               rtt=cluster.overlay.rtt)
        assert reply == {"node": expected.node, "site": "hongo", "cluster": "harness", "make_node": "n1",
                         "cwd": "/wf", "remote": "0", "dir": f"{mount(cluster, expected.node)}/wf",
                         "reason": expected.reason, "inputs": "5", "bytes_local": "1000", "bytes_remote": "701"}
        assert expected.node == "n3"
        # no located input: the node asked; a pinned node wins and is scored as asked
        none = await jobs.place(cwd, ["missing.txt", "/etc/hostname"])
        assert (none["node"], none["inputs"], none["reason"]) == ("n1", "1", "no located inputs: the node asked (n1)")
        pinned = await jobs.place(cwd, ["b.txt", "c.txt"], pin="n4")
        assert (pinned["node"], pinned["bytes_local"], pinned["bytes_remote"]) == ("n4", "600", "1000")
        # the node DAG-aware staging planned: taken when a candidate (600 >= 1000 / 2), not otherwise
        planned = await jobs.place(cwd, ["b.txt", "c.txt"], planned="n4")
        assert (planned["node"], planned["bytes_local"]) == ("n4", "600")
        assert planned["reason"].startswith("planned by DAG-aware staging") and "(the rule alone: n3)" in \
            planned["reason"]
        assert (await jobs.place(cwd, ["b.txt", "a.txt"], planned="n1"))["node"] == "n3"  # 100 < 1000 / 2
        with pytest.raises(ValueError, match="planned on 'n9', which is not a node"):
            await jobs.place(cwd, ["b.txt"], planned="n9")


@trio_test
async def test_place_counts_running_jobs_and_delays_the_next_for_its_holder(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n3"].put("wf/b.txt", b"b" * 1000)
        registered: list[dict[str, object]] = []
        running: set[tuple[int, int]] = set()
        node = cluster["n1"]
        jobs = JobPlacer("n1", cluster.spec, cluster.overlay, node.namespace,  # type: ignore[attr-defined]
                         running_jobs=lambda name: list(registered), alive=lambda client: client in running)
        cwd = f"{mount(cluster, 'n1')}/wf"
        assert cluster.spec.node("n3").slots == 2  # type: ignore[attr-defined]
        # two gmount-job clients answered together fill n3's two slots
        running |= {(10, 1), (11, 1)}
        async with trio.open_nursery() as nursery:
            for pid in (10, 11):
                nursery.start_soon(jobs.place, cwd, ["b.txt"], "", "", (pid, 1))
        assert jobs.load([])[0] == {"n3": 2}
        # a third job on b.txt: n3 stays full, so it waits WAIT_FLOOR (nothing ended on n3 yet, and
        # reading 1000 bytes remotely costs less) and then goes to a free node
        running.add((12, 1))
        started = trio.current_time()
        third = await jobs.place(cwd, ["b.txt"], client=(12, 1))
        assert WAIT_FLOOR <= trio.current_time() - started < WAIT_FLOOR + 1.0
        assert third["node"] != "n3" and third["bytes_remote"] == "1000"
        assert third["reason"].startswith("n3 holds the most input bytes but runs 2 jobs on 2 slots: waited 1.0 s")
        # their own registrations (kind make) do not count twice; another starter's job does
        registered += [{"node": "n3", "pid": 20, "kind": "make", "started": time.time()},
                       {"node": "n2", "pid": 21, "kind": "snakemake", "started": time.time() - 3}]
        counts, ages = jobs.load(list(registered))
        assert counts == {"n3": 2, third["node"]: 1, "n2": 1}
        assert 3 <= max(ages["n2"]) < 5 and all(age < 5 for age in ages["n3"])
        registered.clear()
        # a fourth job waits for n3; one n3 job ends (its gmount-job exits) 0.3 s into the wait: n3
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: trio.sleep(0.3))
            started = trio.current_time()

            async def end_one() -> None:
                await trio.sleep(0.3)
                running.discard((10, 1))

            nursery.start_soon(end_one)
            fourth = await jobs.place(cwd, ["b.txt"])
        assert fourth["node"] == "n3" and 0.3 <= trio.current_time() - started < WAIT_FLOOR
        assert "waited 0.3 s for a free slot" in fourth["reason"]
        # the ended jobs are n3's and n2's typical durations from now on
        assert set(jobs.typical()) == {"n3", "n2"} and jobs.typical()["n2"] >= 3
        # a client that is not a gmount-job (None) is not held: the Snakemake executor asks for many jobs
        assert jobs.load([])[0] == {"n3": 1, third["node"]: 1}


def test_job_clients_are_gmount_job_processes_only() -> None:
    from gmountpy.node.jobs import job_client

    assert job_client(os.getpid()) is None  # python, not gmount-job
    assert job_client(2**22 + 12345) is None  # no such process


@trio_test
async def test_place_resolves_paths_directories_and_links(tmp_path: Path) -> None:
    async with open_cluster(tmp_path) as cluster:
        cluster["n2"].put("data/run/x.bin", b"x" * 300)
        cluster["n2"].put("data/run/deep/y.bin", b"y" * 300)
        cluster["n4"].put("data/run/z.bin", b"z" * 500)
        cluster["n3"].put("data/big.bin", b"b" * 2000)
        os.symlink("../data/big.bin", cluster["n1"].mkdir("links") / "big")
        jobs = placer(cluster)
        cwd = f"{mount(cluster, 'n1')}/wf"
        # a directory stands for every file below it; `..` and another node's mount path both work
        reply = await jobs.place(cwd, ["../data/run"])
        assert (reply["node"], reply["inputs"], reply["bytes_local"], reply["bytes_remote"]) == ("n2", "3", "600",
                                                                                                  "500")
        other = await jobs.place(cwd, [f"{mount(cluster, 'n4')}/data/run/z.bin"])
        assert (other["node"], other["inputs"]) == ("n4", "1")
        # a symbolic link counts as the file it points to
        linked = await jobs.place(cwd, ["../links/big"])
        assert (linked["node"], linked["bytes_local"]) == ("n3", "2000")
        with pytest.raises(ValueError, match="is not inside node n1's mount"):
            await jobs.place("/somewhere/else", [])
        with pytest.raises(ValueError, match="'n9' is not a node of cluster 'harness'"):
            await jobs.place(cwd, [], pin="n9")


def test_requests_and_replies_round_trip() -> None:
    data = jobsocket.encode_request("/m/wf", ["a b", "c"], pin="n2")
    assert decode_request(data) == ("/m/wf", "n2", "", ["a b", "c"])
    assert decode_request(jobsocket.encode_request("/m", [])) == ("/m", "", "", [])
    assert decode_request(jobsocket.encode_request("/m", ["x"], planned="n3")) == ("/m", "", "n3", ["x"])
    reply = {key: f"v-{key}" for key in jobsocket.REPLY_KEYS}
    assert jobsocket.decode_reply(encode_reply(reply)) == reply
    with pytest.raises(jobsocket.JobsError, match="it went wrong"):
        jobsocket.decode_reply(encode_reply(None, "it went wrong"))
    with pytest.raises(ValueError, match="lacks node"):
        jobsocket.decode_reply(b"ok\0site=s\0")
    for bad in (b"", b"gmount-jobs/1\0place\0", b"other/1\0place\0/m\0\0", b"gmount-jobs/1\0place\0/m\0\0x"):
        with pytest.raises(ValueError):
            decode_request(bad)
    with pytest.raises(ValueError, match="NUL"):
        jobsocket.encode_request("/m", ["a\0b"])


def test_socket_path_is_the_one_the_c_client_computes() -> None:
    # FNV-1a 64 of the mountpoint bytes (gmount_job.c: fnv1a64)
    assert jobsocket.fnv1a64(b"") == 0xCBF29CE484222325
    assert jobsocket.fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert jobsocket.socket_path("/tmp/x/n1/mnt", uid=1000) == \
        f"/tmp/gmountpy-1000/jobs-{jobsocket.fnv1a64(b'/tmp/x/n1/mnt'):016x}.sock"


def test_socket_directory_is_made_private(tmp_path: Path) -> None:
    directory = tmp_path / "sockets"
    assert prepare_directory(str(directory)) is None
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    directory.chmod(0o777)
    assert prepare_directory(str(directory)) is None
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    (tmp_path / "file").write_text("")
    assert "is not a directory" in str(prepare_directory(str(tmp_path / "file")))


@trio_test
async def test_serve_jobs_answers_the_client_and_survives_bad_requests(tmp_path: Path) -> None:
    async with open_cluster(tmp_path / "c") as cluster:
        cluster["n3"].put("wf/in.txt", b"data")
        jobs = placer(cluster)
        # under a directory every user may pass through (as /tmp), so that only the socket's own
        # directory stands between another user and the socket
        open_dir = tmp_path / "open"
        open_dir.mkdir()
        for directory in (open_dir, *open_dir.parents):
            if directory == Path("/tmp"):
                break
            directory.chmod(directory.stat().st_mode | 0o711)
        path = str(open_dir / "sockets" / "jobs.sock")
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_jobs, jobs, path)
            assert stat.S_IMODE(os.stat(open_dir / "sockets").st_mode) == 0o700
            # the card make's gmount-job reads for recipes without prerequisites: this node's answer
            card = Path(path[:-len(".sock")] + ".node")
            assert card.read_bytes() == f"n1\0tsukuba\0harness\0{mount(cluster, 'n1')}\0".encode()

            def ask(cwd: str, inputs: list[str]) -> dict[str, str]:
                with socket.socket(socket.AF_UNIX) as sock:
                    sock.connect(path)
                    sock.sendall(jobsocket.encode_request(cwd, inputs))
                    sock.shutdown(socket.SHUT_WR)
                    return jobsocket.decode_reply(b"".join(iter(lambda: sock.recv(4096), b"")))

            def raw(data: bytes) -> bytes:
                with socket.socket(socket.AF_UNIX) as sock:
                    sock.connect(path)
                    sock.sendall(data)
                    sock.shutdown(socket.SHUT_WR)
                    return b"".join(iter(lambda: sock.recv(4096), b""))

            reply = await trio.to_thread.run_sync(ask, f"{mount(cluster, 'n1')}/wf", ["in.txt"])
            assert (reply["node"], reply["bytes_local"]) == ("n3", "4")
            assert (await trio.to_thread.run_sync(raw, b"nonsense")).startswith(b"error\0node n1: truncated")
            with pytest.raises(jobsocket.JobsError, match="node n1: /elsewhere is not inside node n1's mount"):
                await trio.to_thread.run_sync(ask, "/elsewhere", [])
            # another user cannot even reach the socket: its directory is this user's alone
            if os.geteuid() == 0:
                probe = ("import os, socket; s = socket.socket(socket.AF_UNIX)\n"
                         f"os.stat({str(open_dir)!r})\n"  # reachable up to the socket's directory
                         f"try: s.connect({path!r})\nexcept PermissionError: print('refused')")
                refused = await trio.to_thread.run_sync(lambda: subprocess.run(
                    ["/usr/bin/python3", "-c", probe], capture_output=True, text=True, user=65534, check=False))
                assert refused.stdout.strip() == "refused", refused.stderr
            # still serving
            assert (await trio.to_thread.run_sync(ask, f"{mount(cluster, 'n1')}/wf", []))["node"] == "n1"
            nursery.cancel_scope.cancel()
        assert not os.path.exists(path) and not card.exists()  # removed when the daemon stops
