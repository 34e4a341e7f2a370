"""The README's pictures, made by a command (`make screenshots`), never by hand.

- docs/images/stepper.png: notebook 05's generation stepper mid-generation (tests/browser/test_site.py,
  test_readme_stepper_mid_generation, saves it when LLM_ANATOMY_README_IMAGES=1);
- docs/images/attention_explorer.png: notebook 03's attention explorer at layer 5, head 4
  (tests/browser/test_03_attention.py saves it);
- docs/images/roofline.png: notebook 07's measured roofline, the figure of the cell that calls plot_roofline,
  taken from the executed notebook (build/executed/07_prefill_and_decode.ipynb).

Each is scaled to at most MAX_WIDTH pixels and stored as a palette PNG, to stay well under MAX_BYTES.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

from tools.site.pages import ROOT, BuildError, _shown, _source_text, _staleness

IMAGES = ROOT / "docs" / "images"
MAX_WIDTH = 760
MAX_BYTES = 150_000

# README picture: (screenshot saved by the browser tests, what makes it)
SCREENSHOTS = {
    "stepper.png": ("05_stepper_mid_generation.png", "make screenshots (test_site.py::test_readme_stepper_mid_generation)"),
    "attention_explorer.png": ("03_attention_layer5_head4.png", "make screenshots (tests/browser/test_03_attention.py)"),
}
ROOFLINE_NOTEBOOK = "07_prefill_and_decode.ipynb"
ROOFLINE_CALL = "plot_roofline("


def small_png(data: bytes, max_width: int = MAX_WIDTH, max_bytes: int = MAX_BYTES) -> bytes:
    """The picture scaled to max_width at most and stored with a palette, as small as it needs to be."""
    from PIL import Image

    image = Image.open(io.BytesIO(data)).convert("RGB")
    for width, colours in ((max_width, 256), (max_width, 128), (int(max_width * 0.85), 96), (int(max_width * 0.7), 64)):
        picture = image
        if picture.width > width:
            picture = picture.resize((width, round(picture.height * width / picture.width)), Image.Resampling.LANCZOS)
        picture = picture.quantize(colors=colours, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        out = io.BytesIO()
        picture.save(out, format="PNG", optimize=True)
        if out.tell() <= max_bytes:
            return out.getvalue()
    raise BuildError(f"the picture stays over {max_bytes // 1000} KB even at {width} px and {colours} colours")


def roofline_png(executed: Path) -> bytes:
    """The first figure of notebook 07's cell that calls plot_roofline, as it was executed."""
    source = ROOT / "notebooks" / ROOFLINE_NOTEBOOK
    nb, stale = _staleness(source, executed)
    if nb is None:
        raise BuildError(f"the roofline comes from the executed notebook 07: {stale[0]} "
                         "(make screenshots executes it)")
    for cell in nb.cells:
        if cell.cell_type == "code" and ROOFLINE_CALL in _source_text(cell):
            for out in cell.get("outputs", []):
                data = out.get("data", {}).get("image/png")
                if data:
                    return base64.b64decode(data if isinstance(data, str) else "".join(data))
            raise BuildError(f"{_shown(source)}: the cell that calls {ROOFLINE_CALL}) (id {cell.get('id')}) drew no "
                             "figure when it was executed")
    raise BuildError(f"{_shown(source)} has no cell that calls {ROOFLINE_CALL})")


def make_all(executed: Path, screenshots: Path, images: Path = IMAGES) -> list[Path]:
    """Write every README picture; a missing input is reported with what makes it (nothing is skipped)."""
    missing = [f"{_shown(screenshots / shot)} (made by {how}, which drives Chromium: apt-get install chromium)"
               for shot, how in SCREENSHOTS.values() if not (screenshots / shot).is_file()]
    if missing:
        raise BuildError("screenshots missing for the README:\n" + "\n".join(f"- {m}" for m in missing))
    sources = {name: (screenshots / shot).read_bytes() for name, (shot, _) in SCREENSHOTS.items()}
    sources["roofline.png"] = roofline_png(executed)
    images.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in sources.items():
        target = images / name
        target.write_bytes(small_png(data))
        written.append(target)
    return written
