"""`python -m llm_anatomy bench TOPIC`: each topic is a module here with a `main(argv) -> int`."""
