"""The command line, `python -m llm_anatomy ...`: the top layer. Nothing else in the package imports it."""
