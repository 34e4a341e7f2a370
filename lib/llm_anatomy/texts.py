"""Every text the course reads, from one place. All of it ships with Python or with the repository, so all of it
works offline.

    load_corpus()                the corpus notebook 01 trains its BPE on: data/python_docs_topics.txt (about 467 KB)
    python_topic("assignment")   one of Python's documentation topics (`pydoc_data.topics`, the pages help() shows)
    python_topics("truth")       every topic, that one first: as much real English text as a check needs
    python_licence()             the licence text that ships with Python (LICENSE.txt): legal English, another domain
    PROMPTS, STORY_REQUEST       the short prompts the exactness check runs (python -m llm_anatomy check)
    HELD_BACK, HELD_BACK_2       two short stories notebook 01 never shows: exercise 1.1's check trains on them
    editing_task()               notebook 09's proofreading chat, whose answer copies its prompt (prompt lookup drafts)

The corpus file holds the same topics saved once (data/make_corpus.py), so that every Python version trains on the same
text; the topics themselves come from the running Python and can differ a little between versions.
"""

from __future__ import annotations

from collections.abc import Iterator

from .errors import CourseError
from .paths import data_path

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ",
           "Once upon a time, in a small village by the sea, there lived a"]
STORY_REQUEST = "Write a short story about a robot who learns to paint."
# Held back from the learner: the texts exercise 1.1's training loop is checked on (two, so that no constant passes).
HELD_BACK = """The tea shop on the corner opens at seven. Every morning the owner sets out the teapots, then the cups,
then the little plates for the cakes. The first customers are the regulars: the baker, the teacher, the two
brothers who run the bookshop. They talk about the weather, the news and the price of tea. The owner listens,
pours, and smiles. In the afternoon the students arrive, then the tourists, then the quiet readers who stay
until the shop closes. At the end of the day the owner washes the teapots, counts the coins and turns off the
lights. Then the street is dark, and the shop waits for the morning."""
HELD_BACK_2 = """A river runs past the mill, and the miller's daughter rows across it every Sunday. She carries bread
to her grandmother, who lives in a red house with a green door. On the way back she counts the herons, three or
four in winter and a dozen in spring, and she writes the number in a notebook she keeps under the bench."""


def load_corpus(name: str = "python_docs_topics.txt") -> str:
    """A text file from data/ (by default the BPE corpus: Python's documentation topics, about 467 KB)."""
    return data_path(name).read_text(encoding="utf-8")


def _topics() -> dict[str, str]:
    from pydoc_data.topics import topics

    return topics


def python_topic(name: str) -> str:
    """The documentation topic `name` as the running Python ships it (e.g. "assignment", "truth")."""
    topics = _topics()
    if name not in topics:
        raise CourseError(f"Python's documentation has no topic {name!r}; some that it has: "
                          f"{', '.join(sorted(topics)[:5])}.")
    return topics[name]


def python_topics(first: str = "assignment") -> Iterator[str]:
    """Every documentation topic, `first` first and then the others sorted by name."""
    yield python_topic(first)
    topics = _topics()
    yield from (topics[name] for name in sorted(topics) if name != first)


def python_licence() -> str:
    """The running Python's own licence text (LICENSE.txt, the file `license()` prints), looked for where Python's
    `site` module looks: beside the standard library and one folder up (the install's root on Windows)."""
    import os

    here = os.path.dirname(os.__file__)
    places = [os.path.join(folder, name) for folder in (here, os.path.dirname(here)) for name in ("LICENSE.txt", "LICENSE")]
    for place in places:
        if os.path.isfile(place):
            with open(place, encoding="utf-8") as f:
                return f.read()
    raise CourseError(f"this Python ships no licence text (looked for {', '.join(places)}); "
                      "some Linux packages leave it out: use another Python, or pass a text of your own.")


TYPOS = {"evaluates": "evalutes", "remember": "remeber", "single": "singel", "recursively": "recursivly",
         "ultimately": "ultimatly", "exception": "exeption"}


def editing_task(text: str | None = None) -> list[dict]:
    """A chat asking the model to proofread a passage and give it back: most of the answer is copied from
    the prompt, which is what prompt lookup drafts from. By default, two paragraphs of Python's documentation
    (shipped with Python, so offline) with a few spelling mistakes put in."""
    if text is None:
        doc = python_topic("assignment")
        start = doc.index("An assignment statement evaluates")
        text = doc[start:doc.index("The rules", start)].strip()
        for right, wrong in TYPOS.items():
            text = text.replace(right, wrong, 1)
    return [{"role": "user", "content": "Proofread the following text. Reply with the corrected text only.\n\n" + text}]
