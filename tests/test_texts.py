"""texts.py: the course's texts are read offline, and notebook 09's editing task carries its typos."""

import pytest

from llm_anatomy.errors import CourseError
from llm_anatomy.texts import TYPOS, editing_task, load_corpus, python_licence, python_topic


def test_editing_task_puts_each_typo_into_python_documentation():
    (message,) = editing_task()
    assert message["role"] == "user"
    text = message["content"].split("\n\n", 1)[1]
    assert all(wrong in text for wrong in TYPOS.values())
    corrected = text
    for right, wrong in TYPOS.items():
        corrected = corrected.replace(wrong, right, 1)
    assert corrected in python_topic("assignment")  # fixing the typos gives back the documentation's own words


def test_editing_task_takes_a_given_text_as_it_is():
    assert editing_task("Teh cat.")[0]["content"].endswith("\n\nTeh cat.")


def test_unknown_topic_is_refused_with_examples():
    with pytest.raises(CourseError, match="no topic 'nope'"):
        python_topic("nope")


def test_corpus_is_the_python_documentation():
    assert len(load_corpus()) > 400_000


def test_python_licence_is_the_psf_licence():
    assert "PYTHON SOFTWARE FOUNDATION LICENSE" in python_licence()


def test_python_without_a_licence_file_is_refused(monkeypatch, tmp_path):
    import os

    monkeypatch.setattr(os, "__file__", str(tmp_path / "lib" / "os.py"))
    with pytest.raises(CourseError, match="this Python ships no licence text"):
        python_licence()
