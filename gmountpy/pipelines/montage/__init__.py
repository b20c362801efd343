"""The Montage mosaic pipeline (see the Makefile for the DAG)."""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Mapping, Sequence

from ..base import Job, Options, Pipeline, WorkdirFor

STAGES = ("mImgtbl", "mMakeHdr", "mProjectPP", "mOverlaps", "mDiffFit", "mConcatFit", "mBgModel", "mBackground",
          "mAdd", "mViewer")
#: the mosaic must match the single-directory run's within this (relative) tolerance
RTOL = 1e-6


def tiles_table(names: Sequence[str]) -> str:
    """The image list mImgtbl -t reads: fixes the order of the tables whatever the directory order."""
    lines = ["|fname                    |", "|char                     |"]
    lines += [f" {name:<24s} " for name in sorted(names)]
    return "\n".join(lines) + "\n"


def generate(n: int, sites: Mapping[str, Sequence[str]], workdir_for: WorkdirFor, options: Options) -> None:
    """n tiles spread by site; option tile_pixels: the side of a tile (default tiles.TILE_PIXELS)."""
    from .tiles import TILE_PIXELS, plan_tiles, spread_by_site, write_tiles

    unknown = sorted(set(options) - {"tile_pixels"})
    if unknown:
        raise ValueError(f"the montage pipeline has no option {', '.join(unknown)} (it has tile_pixels)")
    pixels = options.get("tile_pixels", TILE_PIXELS)
    tiles = plan_tiles(n, pixels=pixels)
    node_of = spread_by_site(tiles, {s: list(nodes) for s, nodes in sites.items()})
    write_tiles(n, lambda t: os.path.join(workdir_for(node_of[t.index]), "raw", t.name), pixels=pixels)
    first = next(iter(sites.values()))[0]
    with open(os.path.join(workdir_for(first), "tiles.tbl"), "w") as f:
        f.write(tiles_table([t.name for t in tiles]))


def jobs(files: Sequence[str]) -> list[Job]:
    present = set(files)
    tiles = sorted(f[len("raw/"):] for f in files if f.startswith("raw/") and f.endswith(".fits"))
    result: list[Job] = []

    def add(stage: str, output: str, inputs: Sequence[str]) -> None:
        if output in present:
            result.append(Job(stage, output, tuple(inputs)))

    def area(path: str) -> str:
        return path[:-len(".fits")] + "_area.fits"

    add("mImgtbl", "images.tbl", ["tiles.tbl", *(f"raw/{t}" for t in tiles)])
    add("mMakeHdr", "region.hdr", ["images.tbl"])
    for t in tiles:
        add("mProjectPP", f"proj/{t}", [f"raw/{t}", "region.hdr"])
    add("mImgtbl", "pimages.tbl", ["tiles.tbl", *(f"proj/{t}" for t in tiles)])
    add("mOverlaps", "diffs.tbl", ["pimages.tbl"])
    pairs = _pairs(files)
    for pair, (plus, minus) in pairs.items():
        add("mDiffFit", f"fits/fit.{pair}.txt",
            [f"proj/{plus}", f"proj/{minus}", area(f"proj/{plus}"), area(f"proj/{minus}"), "region.hdr"])
    add("mConcatFit", "fits.tbl", ["diffs.tbl", *(f"fits/fit.{p}.txt" for p in pairs)])
    add("mBgModel", "corrections.tbl", ["pimages.tbl", "fits.tbl"])
    for t in tiles:
        add("mBackground", f"corr/{t}", [f"proj/{t}", area(f"proj/{t}"), "pimages.tbl", "corrections.tbl"])
    add("mImgtbl", "cimages.tbl", ["tiles.tbl", *(f"corr/{t}" for t in tiles)])
    add("mAdd", "mosaic.fits", ["cimages.tbl", "region.hdr", *(f"corr/{t}" for t in tiles),
                                *(area(f"corr/{t}") for t in tiles)])
    add("mViewer", "mosaic.png", ["mosaic.fits"])
    return result




def _pairs(files: Sequence[str]) -> dict[str, tuple[str, str]]:
    """pair id -> (plus, minus) tile names, from the fit outputs' names and the tiles (cntr order = tiles.tbl)."""
    tiles = sorted(f[len("raw/"):] for f in files if f.startswith("raw/") and f.endswith(".fits"))
    pairs = {}
    for f in files:
        if f.startswith("fits/fit.") and f.endswith(".txt"):
            pair = f[len("fits/fit."):-len(".txt")]
            a, b = (int(x) for x in pair.split("."))
            pairs[pair] = (tiles[a], tiles[b])
    return dict(sorted(pairs.items()))


def compare(ours: Callable[[str], bytes], reference: Callable[[str], bytes]) -> str | None:
    import numpy as np
    from astropy.io import fits

    with fits.open(io.BytesIO(ours("mosaic.fits"))) as a, fits.open(io.BytesIO(reference("mosaic.fits"))) as b:
        x, y = a[0].data, b[0].data
        if x.shape != y.shape:
            return (f"mosaic.fits is {x.shape[1]}x{x.shape[0]} pixels, "
                    f"the single-directory run's {y.shape[1]}x{y.shape[0]}")
        if not np.array_equal(np.isnan(x), np.isnan(y)):
            differ = int((np.isnan(x) != np.isnan(y)).sum())
            return f"mosaic.fits has blank (NaN) pixels in other places: {differ} differ"
        ok = np.isclose(x, y, rtol=RTOL, atol=0, equal_nan=True)
        if not ok.all():
            worst = float(np.nanmax(np.abs(x - y)))
            return f"{int((~ok).sum())} of {x.size} mosaic pixels differ beyond rtol={RTOL} (largest {worst:g})"
    return None


RULES = {"images_tbl": "mImgtbl", "pimages_tbl": "mImgtbl", "cimages_tbl": "mImgtbl", "region_hdr": "mMakeHdr",
         "project": "mProjectPP", "overlaps": "mOverlaps", "diff_fit": "mDiffFit", "concat_fit": "mConcatFit",
         "bg_model": "mBgModel", "background": "mBackground", "add": "mAdd", "viewer": "mViewer"}

PIPELINE = Pipeline("montage", "tiles", 16, STAGES, generate, jobs, compare, "mosaic.fits", "mosaic.png", RULES)
