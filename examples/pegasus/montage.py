"""A Montage mosaic workflow placed by gmount: one call writes what pegasus-plan needs.

    python examples/pegasus/montage.py CLUSTER ROOT [OUT]

CLUSTER is a running cluster (name or cluster file); ROOT is the namespace
directory holding `raw/*.fits` tiles (on whatever nodes), `region.hdr` and
`images.tbl`. Writes OUT (default ./montage-run) and prints the pegasus-plan
command. The planner and HTCondor are not part of gmountpy; your
transformation catalog names the Montage executables on the node sites.
"""

from __future__ import annotations

import sys

from Pegasus.api import File, Job, Workflow

import gmountpy
import gmountpy.pegasus


def montage(tiles: list[str]) -> Workflow:
    """mProject per tile, mDiffFit per neighbouring pair, mConcatFit, mBgModel, mBackground per tile, mAdd."""
    wf = Workflow("montage")
    hdr, images = File("region.hdr"), File("images.tbl")
    projected = [File(f"proj/p{i}.fits") for i in range(len(tiles))]
    for i, tile in enumerate(tiles):
        raw = File(f"raw/{tile}")
        wf.add_jobs(Job("mProject", _id=f"mProject_{i}").add_args(raw, projected[i], hdr)
                    .add_inputs(raw, hdr).add_outputs(projected[i], stage_out=False))
    fits = [File(f"diff/fit{i}_{i + 1}.txt") for i in range(len(tiles) - 1)]
    for i, fit in enumerate(fits):
        wf.add_jobs(Job("mDiffFit", _id=f"mDiffFit_{i}_{i + 1}").add_args(projected[i], projected[i + 1], fit, hdr)
                    .add_inputs(projected[i], projected[i + 1], hdr).add_outputs(fit, stage_out=False))
    fits_table, corrections = File("fits.tbl"), File("corrections.tbl")
    wf.add_jobs(Job("mConcatFit", _id="mConcatFit").add_inputs(*fits).add_outputs(fits_table, stage_out=False))
    wf.add_jobs(Job("mBgModel", _id="mBgModel").add_args(images, fits_table, corrections)
                .add_inputs(images, fits_table).add_outputs(corrections, stage_out=False))
    corrected = [File(f"corr/c{i}.fits") for i in range(len(tiles))]
    for i, out in enumerate(corrected):
        wf.add_jobs(Job("mBackground", _id=f"mBackground_{i}").add_args(projected[i], out, corrections)
                    .add_inputs(projected[i], corrections).add_outputs(out, stage_out=False))
    wf.add_jobs(Job("mAdd", _id="mAdd").add_args(images, hdr, "mosaic.fits")
                .add_inputs(*corrected, hdr, images).add_outputs(File("mosaic.fits")))
    return wf


def main() -> None:
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    cluster = gmountpy.Cluster.open(sys.argv[1])
    root = sys.argv[2]
    tiles = sorted(e.name for e in cluster.ls(f"{root}/raw").entries if e.name.endswith(".fits"))
    if not tiles:
        sys.exit(f"no raw/*.fits below {root} in cluster {cluster.name}")
    prepared = gmountpy.pegasus.prepare(montage(tiles), cluster, sys.argv[3] if len(sys.argv) == 4 else
                                        "montage-run", root=root, callout=True)
    print(prepared)
    for job, node in sorted(prepared.placements.items()):
        print(f"  {job:<16} -> {node}")
    print(f"pegasus-plan --conf {prepared.properties} --sites {','.join(cluster.nodes.names)} "
          f"--output-sites local --submit {prepared.workflow}")


if __name__ == "__main__":
    main()
