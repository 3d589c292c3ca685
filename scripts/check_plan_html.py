"""Open a `flint plan --report` page in headless Chromium (Debian's `chromium`), offline,
and check it: the browser logs no console message (the page logs none; its self-check
logs an error for a missing or empty chart, and a blocked network fetch would log one),
and the screenshot shows the plots (pixels of the charts' colours: the priced layouts,
the winner, the Pareto front, the timeline's streams).

    python scripts/check_plan_html.py plan.html --screenshot build/plan.png

Prints one JSON line ({"console": [...], "colours": {...}, "ok": ...}); exit 0 when the
page passes, 1 when it does not, 2 when there is no browser to run.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# colours the plots draw with (flint.plan_svg.PALETTE) and the fewest pixels each must
# cover in the screenshot for the plot to count as shown
REQUIRED = {"fits": ("#1f77b4", 30), "winner": ("#d62728", 30), "front": ("#ff7f0e", 20),
            "forward": ("#4c78a8", 200), "backward": ("#54a24b", 200)}
CONSOLE = re.compile(r":CONSOLE[^\]]*\]\s*(.*)")


def browser() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def run_browser(page: Path, screenshot: Path, width: int = 1280, height: int = 3000) -> list:
    """Screenshot `page`; returns the console lines the browser logged. Network is cut
    (every host resolves to nothing), so a page that fetches anything logs an error."""
    exe = browser()
    if exe is None:
        raise FileNotFoundError("no chromium on PATH (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="flint-chromium-") as profile:
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-extensions", f"--user-data-dir={profile}",
               "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0",
               f"--window-size={width},{height}", f"--screenshot={screenshot}",
               page.resolve().as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    lines = []
    for line in (proc.stderr or "").splitlines():
        m = CONSOLE.search(line)
        if m:
            lines.append(m.group(1).strip())
    if not screenshot.is_file():
        raise RuntimeError(f"chromium wrote no screenshot (exit {proc.returncode}): "
                           f"{(proc.stderr or '').strip().splitlines()[-1:]}")
    return lines


def colour_pixels(screenshot: Path) -> dict:
    """Pixels of each required colour (within a small tolerance for anti-aliasing)."""
    from PIL import Image

    img = Image.open(screenshot).convert("RGB")
    counts = {name: 0 for name in REQUIRED}
    targets = {name: tuple(int(hexa[i:i + 2], 16) for i in (1, 3, 5))
               for name, (hexa, _) in REQUIRED.items()}
    for n, (r, g, b) in img.getcolors(maxcolors=1 << 24) or []:
        for name, (tr, tg, tb) in targets.items():
            if abs(r - tr) + abs(g - tg) + abs(b - tb) <= 12:
                counts[name] += n
    return counts


def check(page: Path, screenshot: Path) -> dict:
    console = run_browser(page, screenshot)
    colours = colour_pixels(screenshot)
    missing = [name for name, (_, least) in REQUIRED.items() if colours[name] < least]
    return {"page": str(page), "screenshot": str(screenshot), "console": console,
            "colours": colours, "missing": missing, "ok": not console and not missing}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page")
    ap.add_argument("--screenshot", default=None, help="where to keep the PNG")
    args = ap.parse_args(argv)
    if browser() is None:
        print(json.dumps({"ok": False, "error": "no chromium on PATH"}))
        return 2
    shot = Path(args.screenshot or Path(tempfile.mkdtemp()) / "plan.png")
    shot.parent.mkdir(parents=True, exist_ok=True)
    result = check(Path(args.page), shot)
    print(json.dumps(result, sort_keys=True))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
