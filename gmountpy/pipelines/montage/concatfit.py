"""mConcatFit for Montage 6 on Debian, which ships mFitExec but not mConcatFit.

Each difference job (mDiff + mFitplane, what mDiffFit does in one process)
leaves mFitplane's one-line answer in a small file; this step gathers them,
in diffs.tbl order, into the fits.tbl that mBgModel reads -- the same table,
byte for byte, that mFitExec writes from the same difference images.

    python -m gmountpy.pipelines.montage.concatfit diffs.tbl FITDIR fits.tbl
"""

from __future__ import annotations

import re
import sys

HEADER = ("|     plus|    minus|               a|               b|               c|        crpix1|        crpix2|"
          "      xmin|      xmax|      ymin|      ymax|      xcenter|      ycenter|       npixel|             rms|"
          "            boxx|            boxy|        boxwidth|       boxheight|          boxang|\n")
_FIELD = re.compile(r"(\w+)=(\"[^\"]*\"|[^,\]]+)")


def parse_status(text: str) -> dict[str, str]:
    """The key=value pairs of a Montage `[struct stat=..., ...]` line."""
    line = text.strip().splitlines()[-1] if text.strip() else ""
    return {k: v.strip().strip('"') for k, v in _FIELD.findall(line)}


def read_diffs(path: str) -> list[tuple[int, int, str]]:
    """(cntr1, cntr2, diff file name) rows of an mOverlaps diffs.tbl."""
    rows = []
    with open(path) as f:
        for line in f:
            if line.startswith(("|", "\\")) or not line.strip():
                continue
            parts = line.split()
            rows.append((int(parts[0]), int(parts[1]), parts[4]))
    return rows


def fit_name(diff: str) -> str:
    """diff.000000.000001.fits -> fit.000000.000001.txt"""
    return "fit." + diff[len("diff."):-len(".fits")] + ".txt"


def format_row(plus: int, minus: int, fit: dict[str, str]) -> str:
    f = {k: float(v) for k, v in fit.items() if k not in ("stat", "module", "msg")}
    return (f" {plus:9d} {minus:9d} {f['a']:16.5e} {f['b']:16.5e} {f['c']:16.5e} {f['crpix1']:14.2f} "
            f"{f['crpix2']:14.2f} {int(f['xmin']):10d} {int(f['xmax']):10d} {int(f['ymin']):10d} "
            f"{int(f['ymax']):10d} {f['xcenter']:13.2f} {f['ycenter']:13.2f} {int(f['npixel']):13d} "
            f"{f['rms']:16.5e} {f['boxx']:16.1f} {f['boxy']:16.1f} {f['boxwidth']:16.1f} "
            f"{f['boxheight']:16.1f} {f['boxang']:16.1f} \n")


def concat(diffs_tbl: str, fit_dir: str, out: str) -> int:
    rows = []
    for plus, minus, diff in read_diffs(diffs_tbl):
        with open(f"{fit_dir}/{fit_name(diff)}") as f:
            fit = parse_status(f.read())
        if fit.get("stat") != "OK":
            continue  # mFitExec leaves failed fits out too (e.g. no overlapping pixels)
        rows.append(format_row(plus, minus, fit))
    with open(out, "w") as f:
        f.write(HEADER)
        f.writelines(rows)
    return len(rows)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m gmountpy.pipelines.montage.concatfit diffs.tbl FITDIR fits.tbl", file=sys.stderr)
        return 2
    count = concat(*argv)
    print(f'[struct stat="OK", module="concatfit", count={count}]')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
