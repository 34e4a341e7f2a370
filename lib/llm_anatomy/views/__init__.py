"""What the learner sees: pure HTML strings and matplotlib drawings, one module per picture. No ipywidgets here."""
