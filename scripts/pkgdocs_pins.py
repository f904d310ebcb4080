"""Regenerate (or check) the pin list of source=pkgdocs, src/pretrain/data/sources/pkgdocs_pins.txt,
from the Python that runs this script: every installed distribution but editable ones, `name==version`
(docs/data.md, "The larger offline corpus"). Run it after a dependency change and `make install`:

    .venv/bin/python scripts/pkgdocs_pins.py            # rewrites the shipped pin file
    .venv/bin/python scripts/pkgdocs_pins.py --check    # exit 1, naming the differences, if it is stale
    .venv/bin/python scripts/pkgdocs_pins.py --output my-pins.txt   # then source.pins=my-pins.txt
"""

from __future__ import annotations

import sys

from pretrain.data.sources.pkgdocs_pins import main

if __name__ == "__main__":
    sys.exit(main())
