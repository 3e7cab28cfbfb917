#!/usr/bin/env python
"""Render a report.html in headless Chromium and check the screenshot is not blank.

    python tests/check_report_html.py runs/<sweep>/report/report.html [--png shot.png]
    python tests/check_report_html.py --synthetic OUT_DIR   # build a report from synthetic rows first

Exit status 0 if the page rendered with visible content (not one colour, enough
non-white pixels, a spread of colours as plots have), 1 if blank, 2 if Chromium is missing
(install: apt-get update && apt-get install -y chromium).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def screenshot(
    html_path, png_path, *, chromium: str | None = None, width: int = 1400, height: int = 3000, timeout: float = 120.0
) -> Path:
    """Render file://html_path into png_path with headless Chromium (no network, throwaway profile)."""
    chromium = chromium or find_chromium()
    if chromium is None:
        raise FileNotFoundError("chromium not found; apt-get update && apt-get install -y chromium")
    html_path = Path(html_path).resolve()
    png_path = Path(png_path).resolve()
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--screenshot={png_path}",
            f"--window-size={width},{height}",
            html_path.as_uri(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if not png_path.exists() or png_path.stat().st_size == 0:
        raise RuntimeError(f"chromium wrote no screenshot (rc={proc.returncode}):\n{proc.stderr[-2000:]}")
    return png_path


def blank_stats(png_path) -> dict:
    """Pixel statistics of a screenshot: fraction of non-white pixels, distinct colours."""
    import matplotlib.image as mpimg

    img = mpimg.imread(str(png_path))
    rgb = img[..., :3]
    if rgb.dtype != np.uint8:
        rgb = np.clip(np.round(rgb * 255), 0, 255).astype(np.uint8)
    flat = rgb.reshape(-1, 3)
    non_white = float((flat.min(axis=1) < 235).mean())
    colours = len(np.unique(flat[:: max(1, len(flat) // 200_000)], axis=0))
    return {
        "shape": tuple(rgb.shape),
        "non_white_fraction": non_white,
        "distinct_colours": int(colours),
        "one_colour": bool((flat == flat[0]).all()),
    }


def check(png_path, min_non_white: float = 0.02, min_colours: int = 50) -> tuple[bool, dict]:
    st = blank_stats(png_path)
    ok = (not st["one_colour"]) and st["non_white_fraction"] >= min_non_white and st["distinct_colours"] >= min_colours
    return ok, st


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html", nargs="?", help="report.html to render")
    ap.add_argument("--synthetic", metavar="OUT_DIR", help="first build a report from synthetic rows into OUT_DIR")
    ap.add_argument("--png", help="screenshot path (default: <html dir>/report_screenshot.png)")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=3000)
    args = ap.parse_args(argv)
    if args.synthetic:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.synthetic
        from specbench.report import build_report
        from tests.synthetic import synthetic_sweep

        d = synthetic_sweep(
            alphas={"chat": (0.85, 0.75, 0.65, 0.6), "code": (0.95, 0.9, 0.85, 0.8)},
            batch_sizes=(1, 4),
            gammas=(1, 2, 4, 6),
            n_prompts=8,
            new_tokens=64,
            seed=0,
        )
        html_path = build_report(
            d["rounds"], d["requests"], d["ct"], args.synthetic, title="Synthetic sweep (known parameters)"
        )["html"]
    elif args.html:
        html_path = Path(args.html)
    else:
        ap.error("give a report.html or --synthetic OUT_DIR")
    if find_chromium() is None:
        print("chromium not found; apt-get update && apt-get install -y chromium", file=sys.stderr)
        return 2
    png = Path(args.png) if args.png else Path(html_path).with_name("report_screenshot.png")
    screenshot(html_path, png, width=args.width, height=args.height)
    ok, st = check(png)
    print(f"{'OK' if ok else 'BLANK'}: {png} {st}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
