"""Synthetic sky tiles for the Montage pipeline, written with astropy.

No survey archive is reachable here, so the inputs are made: a grid of
overlapping tiles (TAN projection, slightly rotated and offset like real
pointings) of one sky field with point sources, each tile with its own
background level and tilt -- the differences Montage's background matching
(mDiff/mFitplane/mBgModel/mBackground) exists to remove. Deterministic from
a seed, so a run anywhere makes the same bytes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from astropy.io import fits
from astropy.wcs import WCS

#: Field centre (near M101) and pixel scale (degrees per pixel).
RA0, DEC0 = 210.80, 54.35
SCALE = 1.0 / 3600
TILE_PIXELS = 128
OVERLAP = 0.25  # fraction of a tile shared with each neighbour


@dataclass(frozen=True)
class Tile:
    index: int
    name: str        # tile_007.fits
    row: int
    col: int
    ra: float
    dec: float
    rotation: float  # degrees
    background: float
    slope: tuple[float, float]


def grid_shape(n: int) -> tuple[int, int]:
    """(rows, cols) of a grid holding n tiles, as square as possible (cols >= rows)."""
    if n < 1:
        raise ValueError(f"`n` must be at least 1, got {n}")
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    return rows, cols


def plan_tiles(n: int, seed: int = 2011) -> list[Tile]:
    rng = np.random.default_rng(seed)
    rows, cols = grid_shape(n)
    step = TILE_PIXELS * (1 - OVERLAP) * SCALE
    tiles = []
    for i in range(n):
        row, col = divmod(i, cols)
        dec = DEC0 + (row - (rows - 1) / 2) * step + rng.normal(0, 2 * SCALE)
        ra = RA0 + (col - (cols - 1) / 2) * step / math.cos(math.radians(dec)) + rng.normal(0, 2 * SCALE)
        tiles.append(Tile(i, f"tile_{i:03d}.fits", row, col, ra, dec, float(rng.uniform(-2.0, 2.0)),
                          float(rng.uniform(50.0, 150.0)), (float(rng.normal(0, 0.05)), float(rng.normal(0, 0.05)))))
    return tiles


def _sources(tiles: list[Tile], seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One catalogue of point sources over the whole field: (ra, dec, flux)."""
    rng = np.random.default_rng(seed + 1)
    half = TILE_PIXELS * SCALE
    ras = [t.ra for t in tiles]
    decs = [t.dec for t in tiles]
    count = 40 * len(tiles)
    dec = rng.uniform(min(decs) - half, max(decs) + half, count)
    ra = rng.uniform(min(ras) - half / math.cos(math.radians(DEC0)), max(ras) + half / math.cos(math.radians(DEC0)),
                     count)
    flux = 10 ** rng.uniform(2.0, 4.0, count)
    return ra, dec, flux


def tile_header(tile: Tile) -> fits.Header:
    """Classic CDELT/CROTA2 keywords: what every Montage release reads (its WCS library predates PCi_j)."""
    header = fits.Header()
    header["CTYPE1"], header["CTYPE2"] = "RA---TAN", "DEC--TAN"
    header["CRVAL1"], header["CRVAL2"] = tile.ra, tile.dec
    header["CRPIX1"] = header["CRPIX2"] = (TILE_PIXELS + 1) / 2
    header["CDELT1"], header["CDELT2"] = -SCALE, SCALE
    header["CROTA2"] = tile.rotation
    header["EQUINOX"] = 2000.0
    return header


def tile_wcs(tile: Tile) -> WCS:
    return WCS(tile_header(tile))


def render(tile: Tile, catalogue: tuple[np.ndarray, np.ndarray, np.ndarray], seed: int) -> fits.HDUList:
    w = tile_wcs(tile)
    ra, dec, flux = catalogue
    x, y = w.all_world2pix(ra, dec, 0)
    yy, xx = np.mgrid[0:TILE_PIXELS, 0:TILE_PIXELS].astype(np.float64)
    image = tile.background + tile.slope[0] * (xx - TILE_PIXELS / 2) + tile.slope[1] * (yy - TILE_PIXELS / 2)
    sigma = 1.5
    inside = (x > -8) & (x < TILE_PIXELS + 8) & (y > -8) & (y < TILE_PIXELS + 8)
    for sx, sy, f in zip(x[inside], y[inside], flux[inside], strict=True):
        image += f / (2 * math.pi * sigma**2) * np.exp(-((xx - sx) ** 2 + (yy - sy) ** 2) / (2 * sigma**2))
    image += np.random.default_rng(seed + 100 + tile.index).normal(0, 1.0, image.shape)
    header = tile_header(tile)
    header["BUNIT"] = "DN"
    header["OBJECT"] = f"synthetic tile {tile.index}"
    header["BGLEVEL"] = (round(tile.background, 4), "background offset put into this tile")
    return fits.HDUList([fits.PrimaryHDU(image.astype(np.float32), header)])


def write_tiles(n: int, destination: Callable[[Tile], str], seed: int = 2011) -> list[tuple[Tile, str]]:
    """Write n tiles; `destination(tile)` gives each tile's file path. Returns (tile, path) pairs."""
    tiles = plan_tiles(n, seed)
    catalogue = _sources(tiles, seed)
    written = []
    for tile in tiles:
        path = destination(tile)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        render(tile, catalogue, seed).writeto(path, overwrite=True)
        written.append((tile, path))
    return written


def spread_by_site(tiles: list[Tile], sites: dict[str, list[str]]) -> dict[int, str]:
    """Tile index -> node: each site holds a contiguous band of the sky (as after acquisition at that
    site), shared round-robin among its nodes."""
    order = sorted(tiles, key=lambda t: (t.col, t.row))  # bands of columns
    names = list(sites)
    result: dict[int, str] = {}
    per_site = math.ceil(len(order) / len(names))
    for i, tile in enumerate(order):
        site = names[min(i // per_site, len(names) - 1)]
        nodes = sites[site]
        result[tile.index] = nodes[(i % per_site) % len(nodes)]
    return result


def main(argv: list[str]) -> int:
    """python -m gmountpy.pipelines.montage.tiles N DIR: DIR/raw/tile_*.fits and DIR/tiles.tbl, for one directory."""
    import sys

    if len(argv) != 2 or not argv[0].isdigit():
        print("usage: python -m gmountpy.pipelines.montage.tiles N DIRECTORY", file=sys.stderr)
        return 2
    from . import generate

    generate(int(argv[0]), {"local": ["local"]}, lambda node: argv[1])
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
