"""The first code cell of every notebook, and the Open-in-Colab badge above it (repository upkeep, used by
tools/stamp_notebooks.py and the hygiene tests; not part of the llm_anatomy package).

The cell must work before the course is installed, so it is plain Python with no import
from this package; tools/stamp_notebooks.py writes it into each notebook from the template
below, with the repository address taken from pyproject.toml ([project.urls] Repository).
"""

from __future__ import annotations

SETUP_MARKER = "# Set-up for Google Colab"
SETUP_TAG = "colab-setup"  # the set-up cell's tag: the book (tools/site) leaves the cell out by it
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"

_SETUP_TEMPLATE = '''{marker}: installs the course there (about 2 minutes); anywhere else it does nothing.
import importlib.util, os, subprocess, sys
if "google.colab" in sys.modules and importlib.util.find_spec("llm_anatomy") is None:
    REPO, REF = "{repo}", "{ref}"
    if not os.path.isdir("llm-anatomy"):
        subprocess.run(["git", "clone", "--depth", "1", "--branch", REF, REPO, "llm-anatomy"], check=True)
    # requirements.txt holds version ranges that Colab's own torch already satisfies.
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-r", "llm-anatomy/requirements.txt",
                    "-e", "llm-anatomy"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-r",
                    "llm-anatomy/requirements-nodeps.txt"], check=True)  # xgrammar, for notebook 12
    sys.path.insert(0, os.path.abspath("llm-anatomy/lib"))  # editable installs apply after a restart
    os.chdir("llm-anatomy/notebooks")'''


def setup_cell_source(repo_url: str, ref: str = "main") -> str:
    """The source of the Colab set-up cell for a repository address and a branch or tag."""
    return _SETUP_TEMPLATE.format(marker=SETUP_MARKER, repo=repo_url, ref=ref)


def colab_url(repo_url: str, notebook_path: str, ref: str = "main") -> str:
    """The address that opens `notebook_path` (relative to the repository root) in Colab."""
    prefix = "https://github.com/"
    if not repo_url.startswith(prefix):
        raise ValueError(f"Colab opens notebooks from GitHub only, not {repo_url}")
    slug = repo_url[len(prefix):].rstrip("/").removesuffix(".git")
    return f"https://colab.research.google.com/github/{slug}/blob/{ref}/{notebook_path}"


def badge_markdown(repo_url: str, notebook_path: str, ref: str = "main") -> str:
    """The Markdown line of the Open-in-Colab badge."""
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(repo_url, notebook_path, ref)})"
