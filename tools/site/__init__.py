"""The course as an executed HTML book: `make site` (repository upkeep, not part of the llm_anatomy package).

- capture.py: a pytest plugin (`-p tools.site.capture --executed-to=DIR`) that keeps what nbval executed,
  outputs and figures included, as notebooks in DIR. nbval runs each notebook once; the book reuses that run.
- build.py: renders the executed notebooks into a static book (nbconvert, no execution, nothing from the
  internet) and checks it works offline; pages.py reads the executed notebooks (stale, failed or unrun cells stop
  the build, notebook and cell named); claims.py links each of README's claims to the cells that demonstrate it;
  render.py makes the pages (the Colab cell dropped by its tag, widgets as the stills the browser tests saved) and
  the front page (templates/index.html.j2, static/book.css).
- readme_images.py: the README's pictures (`make screenshots`).

Run `python -m tools.site --help` from the repository root.
"""
