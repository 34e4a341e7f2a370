"""The workshop kit (workshop/) and the repo2docker files (binder/): every file, link and command they
name exists and works, as far as can be checked offline.

postBuild and start are run for real, with a recording stand-in for `python`, so nothing is installed
or downloaded.
"""

from __future__ import annotations

import os
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
WORKSHOP = ROOT / "workshop"
BINDER = ROOT / "binder"
KIT_DOCS = [WORKSHOP / "INSTRUCTOR.md", WORKSHOP / "OFFLINE.md", WORKSHOP / "solutions" / "README.md"]
KIT_FILES = KIT_DOCS + [BINDER / "postBuild", BINDER / "start", BINDER / "requirements.txt", BINDER / "runtime.txt"]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _kit_code() -> str:
    """The code in the kit: fenced blocks and `inline code` of its documents, and the binder scripts."""
    docs = "\n".join(p.read_text() for p in KIT_DOCS)
    blocks = re.findall(r"```[a-z]*\n(.*?)```", docs, flags=re.S)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", docs, flags=re.S))
    scripts = [(BINDER / n).read_text() for n in ("postBuild", "start")]
    return "\n".join(blocks + spans + scripts)


def _cli_commands() -> set[str]:
    run = run_cli("--help")
    assert run.code == 0, run.err
    out = run.out
    match = re.search(r"\{([\w,-]+)\}", out)
    assert match, f"no sub-commands in the CLI's help:\n{out}"
    return set(match.group(1).split(","))


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([\w-]+):", text, flags=re.M))


# --------------------------------------------------------------------------- files and links


@pytest.mark.parametrize("path", KIT_FILES, ids=[p.relative_to(ROOT).as_posix() for p in KIT_FILES])
def test_kit_file_exists_and_is_not_empty(path):
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing"
    assert path.read_text().strip()


def test_every_workshop_file_the_library_names_exists():
    """Error messages send learners to workshop/...: those files must be there."""
    named = set()
    for source in (ROOT / "lib").rglob("*.py"):
        named.update(re.findall(r"workshop/[\w./-]+\.\w+", source.read_text()))
    assert "workshop/OFFLINE.md" in named
    missing = sorted(n for n in named if not (ROOT / n.rstrip(".")).exists())
    assert not missing, f"the library refers to missing files: {missing}"


@pytest.mark.parametrize("doc", KIT_DOCS, ids=[p.relative_to(ROOT).as_posix() for p in KIT_DOCS])
def test_relative_links_resolve(doc):
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text())
    local = [link for link in links if not re.match(r"\w+://", link)]
    broken = [link for link in local if not (doc.parent / link).exists()]
    assert not broken, f"{doc.name} links to missing files: {broken}"


def test_the_binder_link_points_at_the_repository():
    """The mybinder.org address is built from the one repository address in pyproject.toml."""
    repo = PYPROJECT["project"]["urls"]["Repository"].removeprefix("https://github.com/").rstrip("/")
    urls = re.findall(r"https://mybinder\.org/v2/gh/([\w.-]+/[\w.-]+)/([\w.-]+)\?urlpath=lab/tree/(\S+?)`",
                      (WORKSHOP / "INSTRUCTOR.md").read_text())
    assert urls, "INSTRUCTOR.md gives no mybinder.org address"
    for slug, _ref, path in urls:
        assert slug == repo, f"the Binder address names {slug}, pyproject.toml says {repo}"
        assert (ROOT / path).exists(), f"the Binder address opens {path}, which does not exist"


def test_the_timing_table_covers_every_notebook():
    text = (WORKSHOP / "INSTRUCTOR.md").read_text()
    rows = set(re.findall(r"^\| (\d\d) ", text, flags=re.M))
    assert NOTEBOOKS
    missing = [p.name for p in NOTEBOOKS if p.name[:2] not in rows]
    assert not missing, f"INSTRUCTOR.md has no timing row for {missing}"


def test_the_timing_table_states_each_notebooks_own_time():
    """The full-day column's minutes (or the homework's) are the notebook's own **Time** estimate."""
    text = (WORKSHOP / "INSTRUCTOR.md").read_text()
    for path in NOTEBOOKS:
        opening = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"][:8])
        stated = re.search(r"\*\*Time\.\*\* About (\d+) minutes", opening)
        row = re.search(rf"^\| {path.name[:2]} .*\|([^|]*)\|\s*$", text, flags=re.M)
        assert stated and row, f"{path.name}: no **Time** estimate at the top, or no row in INSTRUCTOR.md"
        planned = re.search(r"(\d+) min", row.group(1))
        assert planned and planned.group(1) == stated.group(1), \
            f"{path.name} states {stated.group(1)} minutes; INSTRUCTOR.md's full day gives {row.group(1).strip()!r}"


def test_every_solution_module_has_its_checks():
    """workshop/solutions/chNN.py goes with lib/llm_anatomy/exercises/chNN.py and a test that runs both."""
    for module in sorted((WORKSHOP / "solutions").glob("ch[0-9][0-9].py")):
        assert (ROOT / "lib" / "llm_anatomy" / "exercises" / module.name).exists(), \
            f"{module.name} has no checks in lib/llm_anatomy/exercises/"
        assert (ROOT / "tests" / "exercises" / f"test_exercises_{module.stem}.py").exists(), \
            f"{module.name} is not tested: add tests/exercises/test_exercises_{module.stem}.py"
    # The guide's way to show a solution from a notebook: %load ../workshop/solutions/chNN.py
    assert (ROOT / "notebooks" / ".." / "workshop" / "solutions").is_dir()


# --------------------------------------------------------------------------- commands


def test_every_course_command_the_kit_names_exists():
    commands = _cli_commands()
    named = set(re.findall(r"python -m llm_anatomy (\w+)", _kit_code()))
    assert {"fetch", "doctor"} <= named, "the kit must name the fetch and doctor commands"
    assert named <= commands, f"the kit names commands the CLI lacks: {sorted(named - commands)}"
    for command in named:  # in this process: the real entry has its subprocess test (doctor's just below)
        result = run_cli(command, "--help")
        assert result.code == 0 and result.out, f"`python -m llm_anatomy {command} --help` failed:\n{result.err}"


def test_every_make_target_the_kit_names_exists():
    targets = _make_targets()
    named = set(re.findall(r"\bmake ([\w-]+)", _kit_code()))
    assert "doctor" in named
    assert named <= targets, f"the kit names make targets the Makefile lacks: {sorted(named - targets)}"


def test_make_doctor_runs_the_doctor_command():
    out = subprocess.run(["make", "-n", "doctor"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    assert re.search(r"python -m llm_anatomy doctor$", out, flags=re.M), out


def test_files_the_pip_commands_name_exist():
    for name in set(re.findall(r"-r ([\w./-]+\.txt)", _kit_code())):
        assert (ROOT / name).exists(), f"the kit installs from {name}, which does not exist"


@pytest.mark.integration
def test_the_pre_workshop_check_passes_here():
    """`python -m llm_anatomy doctor` is what learners run: on a prepared machine it says all is good. The doctor
    command's one subprocess test (tests/weights/test_load.py runs it in this process)."""
    result = subprocess.run([sys.executable, "-m", "llm_anatomy", "doctor"], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All good: the course is ready to run." in result.stdout


# --------------------------------------------------------------------------- repo2docker (binder/)


def test_binder_requirements_reach_the_root_requirements():
    """binder/ hides the root's files from repo2docker, so binder/requirements.txt must include them."""
    lines = [l.strip() for l in (BINDER / "requirements.txt").read_text().splitlines()
             if l.strip() and not l.startswith("#")]
    includes = [l.split(None, 1)[1] for l in lines if l.startswith("-r ")]
    assert "../requirements.txt" in includes
    for include in includes:
        assert (BINDER / include).resolve().is_file(), f"binder/requirements.txt includes missing {include}"
    assert not any(l.startswith("torch") for l in lines), "torch comes from requirements.txt, as a range"


def test_binder_python_satisfies_the_project():
    version = (BINDER / "runtime.txt").read_text().strip()
    match = re.fullmatch(r"python-(\d+)\.(\d+)", version)
    assert match, f"runtime.txt must read python-X.Y, not {version!r}"
    needed = re.fullmatch(r">=(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert tuple(map(int, match.groups())) >= tuple(map(int, needed.groups()))


@pytest.mark.parametrize("name", ["postBuild", "start"])
def test_binder_scripts_are_executable_bash(name):
    path = BINDER / name
    assert os.access(path, os.X_OK), f"binder/{name} must be executable (chmod +x): repo2docker runs it directly"
    assert path.read_text().startswith("#!/bin/bash\n")
    subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)


@pytest.fixture
def fake_python(tmp_path):
    """A `python` on PATH that records its arguments and LLM_ANATOMY_CACHE, and does nothing else."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    script = bin_dir / "python"
    script.write_text(f'#!/bin/bash\necho "$* | cache=$LLM_ANATOMY_CACHE" >> "{log}"\n')
    script.chmod(0o755)
    return bin_dir, log


def _env(bin_dir: Path, home: Path, **extra) -> dict:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "NB_PYTHON_PREFIX": str(home.parent / "conda")}
    env.update(extra)
    return env


def test_postbuild_installs_the_course_then_bakes_the_model_outside_home(fake_python, tmp_path):
    bin_dir, log = fake_python
    home = tmp_path / "home"
    home.mkdir()
    subprocess.run([str(BINDER / "postBuild")], cwd=ROOT, env=_env(bin_dir, home), check=True, timeout=60)
    calls = log.read_text().splitlines()
    args = [c.split(" | ")[0] for c in calls]
    install = next(i for i, a in enumerate(args) if a.startswith("-m pip install"))
    assert args[install].split()[-2:] == ["-e", "."], "postBuild must install the course's package from the clone"
    fetch = args.index("-m llm_anatomy fetch")
    assert install < fetch, "install the package before fetching the model"
    assert args.index("-m llm_anatomy doctor") > fetch, "check the image after fetching"
    cache = calls[fetch].split("cache=")[1]
    assert cache and not cache.startswith(str(home)), "the model must be baked outside the home folder"
    assert cache.startswith(str(tmp_path / "conda"))


def test_start_points_at_the_baked_model_and_copies_the_notebooks_once(fake_python, tmp_path):
    bin_dir, log = fake_python
    home, repo = tmp_path / "home", tmp_path / "srv" / "repo"
    home.mkdir()
    (repo / "notebooks").mkdir(parents=True)
    (repo / "notebooks" / "00_x.ipynb").write_text("original")
    env = _env(bin_dir, home, REPO_DIR=str(repo))
    subprocess.run([str(BINDER / "postBuild")], cwd=ROOT, env=env, check=True, timeout=60)
    baked = log.read_text().splitlines()[-1].split("cache=")[1]

    out = subprocess.run([str(BINDER / "start"), "bash", "-c", 'echo "$LLM_ANATOMY_CACHE"'], env=env,
                         capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert out == baked, "start must point the course at the folder postBuild filled"
    copy = home / "llm-anatomy" / "notebooks" / "00_x.ipynb"
    assert copy.read_text() == "original"
    copy.write_text("the learner's work")
    subprocess.run([str(BINDER / "start"), "true"], env=env, check=True, timeout=60)
    assert copy.read_text() == "the learner's work", "a restart must never overwrite a learner's notebooks"


def test_start_without_a_separate_repository_copies_nothing(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "REPO_DIR": str(home)}
    result = subprocess.run([str(BINDER / "start"), "bash", "-c", "exit 7"], env=env, timeout=60)
    assert result.returncode == 7, "start must exec the server command and pass its status through"
    assert not (home / "llm-anatomy").exists()
