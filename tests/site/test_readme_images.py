"""The README's pictures: made by `make screenshots` (tools/site/readme_images.py), committed, small."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tools.site import readme_images  # noqa: E402
from tools.site.build import BuildError  # noqa: E402

NAMES = ["stepper.png", "attention_explorer.png", "roofline.png"]


def test_the_readme_shows_every_picture_and_each_is_a_small_png():
    from PIL import Image

    readme = (ROOT / "README.md").read_text()
    shown = re.findall(r"!\[[^\]]+\]\((docs/images/[\w.-]+\.png)\)", readme)
    assert sorted(shown) == sorted(f"docs/images/{n}" for n in NAMES), "README shows other pictures than make makes"
    for name in NAMES:
        path = readme_images.IMAGES / name
        assert path.is_file(), f"{path.relative_to(ROOT)} is missing: run `make screenshots`"
        assert path.stat().st_size < readme_images.MAX_BYTES, f"{name} is {path.stat().st_size} bytes"
        with Image.open(path) as image:
            assert image.format == "PNG" and image.width <= readme_images.MAX_WIDTH


def test_small_png_scales_and_shrinks_a_large_screenshot():
    from PIL import Image

    noisy = Image.effect_noise((1600, 1200), 60).convert("RGB")  # hard to compress, on purpose
    out = io.BytesIO()
    noisy.save(out, format="PNG")
    small = readme_images.small_png(out.getvalue(), max_bytes=400_000)
    with Image.open(io.BytesIO(small)) as image:
        assert image.width <= readme_images.MAX_WIDTH and image.mode == "P"
    assert len(small) <= 400_000


def test_missing_screenshots_are_reported_not_skipped(tmp_path):
    with pytest.raises(BuildError, match=r"screenshots missing for the README[\s\S]*05_stepper_mid_generation\.png"):
        readme_images.make_all(executed=tmp_path, screenshots=tmp_path, images=tmp_path / "images")
    assert not (tmp_path / "images").exists()
