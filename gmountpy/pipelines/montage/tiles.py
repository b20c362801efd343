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
TILE_PIXELS = 128  # the default side of a tile; `gmount pipeline montage --tile-pixels N` changes it
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
    pixels: int = TILE_PIXELS  # side of the (square) tile


def grid_shape(n: int) -> tuple[int, int]:
    """(rows, cols) of a grid holding n tiles, as square as possible (cols >= rows)."""
    if n < 1:
        raise ValueError(f"`n` must be at least 1, got {n}")
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    return rows, cols


def plan_tiles(n: int, seed: int = 2011, pixels: int = TILE_PIXELS) -> list[Tile]:
    """n tiles of pixels x pixels on a grid; larger tiles cover more sky (same scale and overlap), so
    Montage's jobs take longer while the DAG stays the same."""
    if pixels < 16:
        raise ValueError(f"tiles must be at least 16 pixels wide, got {pixels}")
    rng = np.random.default_rng(seed)
    rows, cols = grid_shape(n)
    step = pixels * (1 - OVERLAP) * SCALE
    tiles = []
    for i in range(n):
        row, col = divmod(i, cols)
        dec = DEC0 + (row - (rows - 1) / 2) * step + rng.normal(0, 2 * SCALE)
        ra = RA0 + (col - (cols - 1) / 2) * step / math.cos(math.radians(dec)) + rng.normal(0, 2 * SCALE)
        tiles.append(Tile(i, f"tile_{i:03d}.fits", row, col, ra, dec, float(rng.uniform(-2.0, 2.0)),
                          float(rng.uniform(50.0, 150.0)), (float(rng.normal(0, 0.05)), float(rng.normal(0, 0.05))),
                          pixels))
    return tiles


def _sources(tiles: list[Tile], seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One catalogue of point sources over the whole field: (ra, dec, flux)."""
    rng = np.random.default_rng(seed + 1)
    half = tiles[0].pixels * SCALE
    ras = [t.ra for t in tiles]
    decs = [t.dec for t in tiles]
    count = round(40 * len(tiles) * (tiles[0].pixels / TILE_PIXELS) ** 2)  # same density of sources
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
    header["CRPIX1"] = header["CRPIX2"] = (tile.pixels + 1) / 2
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
    side = tile.pixels
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float64)
    image = tile.background + tile.slope[0] * (xx - side / 2) + tile.slope[1] * (yy - side / 2)
    sigma = 1.5
    inside = (x > -8) & (x < side + 8) & (y > -8) & (y < side + 8)
    reach = 12  # pixels: beyond this a source adds < 1e-11, far below float32 resolution of the sky level
    for sx, sy, f in zip(x[inside], y[inside], flux[inside], strict=True):
        # only the stamp around the source: large tiles hold many sources, each touching few pixels
        x0, x1 = max(int(sx) - reach, 0), min(int(sx) + reach + 1, side)
        y0, y1 = max(int(sy) - reach, 0), min(int(sy) + reach + 1, side)
        if x0 >= x1 or y0 >= y1:
            continue
        dx, dy = xx[y0:y1, x0:x1] - sx, yy[y0:y1, x0:x1] - sy
        image[y0:y1, x0:x1] += f / (2 * math.pi * sigma**2) * np.exp(-(dx**2 + dy**2) / (2 * sigma**2))
    image += np.random.default_rng(seed + 100 + tile.index).normal(0, 1.0, image.shape)
    header = tile_header(tile)
    header["BUNIT"] = "DN"
    header["OBJECT"] = f"synthetic tile {tile.index}"
    header["BGLEVEL"] = (round(tile.background, 4), "background offset put into this tile")
    return fits.HDUList([fits.PrimaryHDU(image.astype(np.float32), header)])


def write_tiles(n: int, destination: Callable[[Tile], str], seed: int = 2011,
                pixels: int = TILE_PIXELS) -> list[tuple[Tile, str]]:
    """Write n tiles of pixels x pixels; `destination(tile)` gives each tile's file path. Returns (tile, path)
    pairs."""
    tiles = plan_tiles(n, seed, pixels)
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

    generate(int(argv[0]), {"local": ["local"]}, lambda node: argv[1], {})
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
