"""The course as an executed HTML book: `make site` (repository upkeep, not part of the llm_anatomy package).

- capture.py: a pytest plugin (`-p tools.site.capture --executed-to=DIR`) that keeps what nbval executed,
  outputs and figures included, as notebooks in DIR. nbval runs each notebook once; the book reuses that run.
- build.py: renders the executed notebooks into a static book (nbconvert, no execution, nothing from the
  internet): one page per notebook, a contents page in course order, the claims table linked to the cells that
  demonstrate each claim, the machine it ran on, and widgets shown as stills saved by the browser tests.
- readme_images.py: the README's pictures (`make screenshots`).

Run `python -m tools.site --help` from the repository root.
"""
