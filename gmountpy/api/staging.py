"""Staging: copying files into one node's export as verified replicas, with progress."""

from __future__ import annotations

import errno
from collections.abc import Iterable

import trio

from .._trio import open_nursery
from ..errors import GmountError, PeerUnavailable
from ..protocol import messages as msg
from ..protocol.client import ClusterClient
from .paths import PathLike, Paths, as_list
from .requests import Requests
from .results import Node, StagedFile, StageError, StageFailure, StageReport
from .view import ClusterView

#: Staging shows a progress bar on its own from this many bytes on.
PROGRESS_FROM_BYTES = 64 * 1024 * 1024


class Staging:
    """`api.Cluster.stage` (documented there)."""

    def __init__(self, view: ClusterView, paths: Paths, requests: Requests) -> None:
        self._view = view
        self._paths = paths
        self._requests = requests

    def stage(self, paths: PathLike | Iterable[PathLike], to: str | Node, *, concurrency: int = 4,
              progress: bool | None = None) -> StageReport:
        target = self._view.node_name(to)
        if concurrency < 1:
            raise ValueError(f"`concurrency` must be at least 1, got {concurrency}")
        ns_paths = [self._paths.resolve(p, None)[0] for p in as_list(paths)]

        async def main(client: ClusterClient) -> StageReport:
            files, missing = await self._requests.expand(client, target, ns_paths)
            failures = [StageFailure(p, "no node holds it") for p in missing]
            staged: list[StagedFile] = []
            total = sum(size for _, size in files)
            show = progress if progress is not None else total >= PROGRESS_FROM_BYTES
            bar = StageProgress(target, len(files), total) if show and files else None
            limiter = trio.CapacityLimiter(concurrency)
            fatal: list[BaseException] = []

            async def one(path: str, size: int, scope: trio.CancelScope) -> None:
                async with limiter:
                    try:
                        reply = await client.ask(target, msg.Stage(path), timeout=60.0 + size / 20e6)
                    except PeerUnavailable as exc:
                        fatal.append(GmountError(f"cannot stage to node {target}: {exc.strerror or exc}"))
                        scope.cancel()
                        return
                    except OSError as exc:
                        if exc.errno == errno.ENOSYS:
                            fatal.append(GmountError(f"node {target} cannot stage files: its daemon has no "
                                                     "'stage' operation (restart the cluster with this gmountpy)"))
                            scope.cancel()
                            return
                        failures.append(StageFailure(path, exc.strerror or str(exc)))
                    else:
                        staged.append(StagedFile(path, reply["status"], reply["source"], int(reply["size"]),
                                                 reply.get("sha256"), float(reply["seconds"])))
                    if bar is not None:
                        bar.advance(size)

            try:
                async with open_nursery() as nursery:
                    for path, size in files:
                        nursery.start_soon(one, path, size, nursery.cancel_scope)
            finally:
                if bar is not None:
                    bar.close()
            if fatal:
                raise fatal[0]
            order = {p: i for i, (p, _) in enumerate(files)}
            report = StageReport(target, tuple(sorted(staged, key=lambda f: order[f.path])),
                                 tuple(sorted(failures, key=lambda f: f.path)))
            return report

        report = self._requests.run(main)
        if report.failures:
            raise StageError(report)
        return report


class StageProgress:
    """A rich progress bar by bytes, with the file count in its description."""

    def __init__(self, target: str, files: int, total: int) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        self._files = files
        self._done = 0
        self._target = target
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                                  TransferSpeedColumn(), TimeRemainingColumn())
        self._task = self._progress.add_task(self._describe(), total=total)
        self._progress.start()

    def _describe(self) -> str:
        return f"staging to {self._target}: {self._done}/{self._files} files"

    def advance(self, size: int) -> None:
        self._done += 1
        self._progress.update(self._task, advance=size, description=self._describe())

    def close(self) -> None:
        self._progress.stop()
