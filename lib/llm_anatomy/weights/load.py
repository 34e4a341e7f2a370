"""Loading the course's model: the offline default, or any hub model when online.

`load_model()` gives a LoadedModel: the transformers model, its tokenizer, config, device and dtype.
The default model comes from the course's own cache (models/cache.py); a hub id needs network once.
`transformers_model(x)` is the one place that unwraps a LoadedModel into the transformers module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..device import default_dtype, describe_device, pick_device, timed, use_cpu_threads
from ..errors import CourseError
from .cache import DEFAULT_MODEL, cache_problems, default_model_dir, fetch_default_model, sha256_of

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


def checkpoint_name(name: str) -> str:
    """The checkpoint's (transformers') name of the course model's parameter `name`: the blocks, embedding and final
    norm sit under `model.` in a Llama-family checkpoint (`model.layers.0.self_attn.q_proj.weight`), the LM head does
    not. The one place the two namings meet: ScratchLlama.from_hf and the tensor-parallel loader read through it."""
    return name if name == "lm_head.weight" else f"model.{name}"


def transformers_model(model) -> torch.nn.Module:
    """The transformers module inside a LoadedModel (or the module itself): the course's one unwrapper."""
    module = model.model if isinstance(model, LoadedModel) else model
    if not isinstance(module, torch.nn.Module):
        raise CourseError(f"Expected a model from load_model() or a transformers model, not {type(model).__name__}.")
    return module


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
    Returns a LoadedModel (model in eval mode, tokenizer, config, device, dtype, name). The weights are frozen
    (requires_grad False): inference needs no gradient, so a direct call records no autograd graph. The model is
    still differentiable: `loaded.model.requires_grad_(True)` before taking a gradient or training.
    """
    if name is not None and not isinstance(name, str):
        raise CourseError(f"The model name must be a string or None, not {type(name).__name__}.")
    chosen = pick_device(device)
    dtype = dtype or default_dtype(chosen)
    threads = use_cpu_threads(chosen)  # the course's thread policy: one torch thread per core free now
    seconds, loaded = timed(lambda: _load(name, chosen, dtype), chosen)
    if verbose:
        family = getattr(loaded.config, "model_type", "?")
        note = "" if family in SCRATCH_FAMILIES else f" (note: {family} is not Llama-family; the from-scratch chapters need one)"
        print(f"Loaded {loaded.name}: {loaded.num_parameters / 1e6:.1f} M parameters on "
              f"{describe_device(loaded.device)} in {str(loaded.dtype).removeprefix('torch.')}, {seconds:.1f} s{note}")
        if threads is not None:
            print(f"CPU threads: {threads}")
    return loaded


def _load(name: str | None, chosen: torch.device, dtype: torch.dtype) -> LoadedModel:
    if name is None or name == DEFAULT_MODEL:
        return _load_default(chosen, dtype)
    elif Path(name).expanduser().is_dir() and (Path(name).expanduser() / "config.json").exists():
        folder, label = Path(name).expanduser(), Path(name).name
    elif HUB_ID.match(name):
        folder, label = _hub_snapshot(name), name
    else:
        raise CourseError(
            f"Unknown model {name!r}: use load_model() for the offline default ({DEFAULT_MODEL}), "
            "a hub id such as 'HuggingFaceTB/SmolLM2-360M-Instruct' (needs network), or a local folder."
        )
    return _finish(_load_folder(folder, chosen, dtype), label)


def _load_default(device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Load the default model while a second thread checks the cache's SHA-256 sums.

    Hashing 540 MB takes about half a second; done beside the load it costs almost nothing.
    If the check fails, the loaded model is thrown away and the cache is rebuilt.
    """
    from concurrent.futures import ThreadPoolExecutor

    folder = default_model_dir()
    if cache_problems(folder, check_hashes=False):  # missing or truncated: fetch first
        fetch_default_model()
        return _finish(_load_folder(folder, device, dtype), DEFAULT_MODEL)
    with ThreadPoolExecutor(max_workers=1) as pool:
        check = pool.submit(cache_problems, folder)
        loaded = _load_folder(folder, device, dtype)
        problems = check.result()
    if problems:
        del loaded
        fetch_default_model()  # says what is damaged, and rebuilds it
        loaded = _load_folder(folder, device, dtype)
    return _finish(loaded, DEFAULT_MODEL)


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
    return model.to(device).eval().requires_grad_(False), tokenizer  # frozen: see load_model


def _finish(model_and_tokenizer, label: str) -> LoadedModel:
    model, tokenizer = model_and_tokenizer
    return LoadedModel(model, tokenizer, model.config, model.device, model.dtype, label)
