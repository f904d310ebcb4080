"""Draw numbered callouts onto a `pretrain compare` figure for the docs (docs/training.md, "What you will
see"): ① the train loss lines, ② the validation markers, ③ the floors, ④ the padding waste bars,
⑤ the truncated pairs, ⑥ tokens/s and ⑦ the legend with each arm's comparison.

The callouts are placed for the figure `make try` draws (two arms, one seed each, time panel on):
positions are fractions of the image's width and height, so any size of that layout works; another
layout needs other positions (CALLOUTS). Writes a PNG at ~80 dpi (the source's pixels: ~200 KB).

    python scripts/annotate_figure.py        # outputs/try/latest/compare.png -> docs/images/
    python scripts/annotate_figure.py my.png --output my-annotated.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "outputs" / "try" / "latest" / "compare.png"
OUTPUT = REPO / "docs" / "images" / "compare-annotated.png"
DPI = 80

# (number, label, where the label sits, what its arrows point at): (x, y) as fractions of the image's
# width and height from its top-left corner, read off the 1600 x 1070 figure of `make try`.
CALLOUTS: list[tuple[str, str, tuple[float, float], list[tuple[float, float]]]] = [
    ("①", "train loss (EMA; raw faint)", (0.105, 0.345), [(0.197, 0.222)]),
    ("②", "validation loss markers", (0.265, 0.375), [(0.223, 0.261), (0.289, 0.277)]),
    ("③", "floors: unigram, bigram", (0.17, 0.465), [(0.12, 0.409), (0.12, 0.515)]),
    ("④", "padding waste per arm", (0.17, 0.70), [(0.19, 0.885)]),
    ("⑤", "truncated pairs (never trained)", (0.50, 0.70), [(0.50, 0.885)]),
    ("⑥", "real tokens / s", (0.935, 0.755), [(0.80, 0.71)]),
    ("⑦", "legend: each arm\nvs the reference", (0.93, 0.44), [(0.935, 0.345)]),
]
COLOR = "#d4008f"  # a magenta that none of the policies' colours is


def annotate(source: Path, output: Path, dpi: int = DPI) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    image = plt.imread(source)
    height, width = image.shape[:2]
    figure = plt.figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    axes = figure.add_axes((0, 0, 1, 1))
    axes.imshow(image)
    axes.set_axis_off()
    for number, label, (x, y), targets in CALLOUTS:
        for tx, ty in targets:  # arrows from the label's centre, drawn under its box
            axes.annotate(
                "",
                xy=(tx * width, ty * height),
                xytext=(x * width, y * height),
                arrowprops={"arrowstyle": "-|>", "color": COLOR, "linewidth": 2, "shrinkA": 0, "shrinkB": 2},
                zorder=3,
            )
        box = {"boxstyle": "round,pad=0.3", "facecolor": "white", "edgecolor": COLOR, "linewidth": 1.5}
        axes.text(
            x * width,
            y * height,
            f"{number} {label}",
            ha="center",
            va="center",
            fontsize=13,
            fontweight="bold",
            color=COLOR,
            bbox=box,
            zorder=4,
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=dpi)
    plt.close(figure)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", nargs="?", type=Path, default=SOURCE, help=f"the figure (default {SOURCE})")
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"the annotated PNG (default {OUTPUT})")
    parser.add_argument("--dpi", type=int, default=DPI)
    args = parser.parse_args(argv)
    written = annotate(args.source, args.output, args.dpi)
    print(f"wrote {written} ({written.stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
