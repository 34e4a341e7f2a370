"""Write python_docs_topics.txt: the corpus notebook 01 trains its BPE on.

The text is the documentation topics that ship with Python itself (`pydoc_data.topics`,
the pages `help('if')` shows), so the corpus is available offline on every machine.
We keep the file in the repository so that every Python version trains on the same text.

    python data/make_corpus.py      # rewrites data/python_docs_topics.txt
"""

from pathlib import Path


def corpus_text() -> str:
    """Every topic, sorted by name, each under a '== name ==' heading; returns the text."""
    from pydoc_data.topics import topics

    parts = [f"== {name} ==\n\n{topics[name].strip()}\n" for name in sorted(topics)]
    return "\n".join(parts)


if __name__ == "__main__":
    out = Path(__file__).resolve().parent / "python_docs_topics.txt"
    text = corpus_text()
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out.name}: {len(text.encode('utf-8')):,} bytes, {len(text):,} characters")
