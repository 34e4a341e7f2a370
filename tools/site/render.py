"""The book's HTML: each executed notebook through nbconvert's lab template, widgets as stills, and the front page.

- the Colab set-up cell (tagged `colab-setup` by tools/stamp_notebooks.py) is dropped by nbconvert's
  TagRemovePreprocessor: it does nothing outside Colab (the badge above it stays, as a link);
- each widget output becomes a still of its real rendering that the browser tests saved; the widget is known by
  the root CSS class its repr names (`Stepper(root_class='la-stepper')`, llm_anatomy.widgets.base.CourseWidget);
- the front page is templates/index.html.j2, README's table cells rendered by nbconvert's Markdown renderer
  (mistune); the book's own CSS is static/book.css, JupyterLab's is copied from nbconvert's lab template.
"""

from __future__ import annotations

import copy
import datetime as _dt
import html
import re
import shutil
from pathlib import Path

from tools.colab import SETUP_TAG
from tools.site.pages import BOOK_NAME, Book, BuildError, Page, _cell_name, _shown, _source_text

HERE = Path(__file__).resolve().parent
TEMPLATES, STATIC = HERE / "templates", HERE / "static"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
ROOT_CLASS = re.compile(r"""^\s*(\w+)\(root_class=["'](la-[a-z0-9-]+)["']""")

# The still the book shows for a widget (its root class): as the cell creates it where that says enough, else after
# the browser test has used it (the caption says so). Others use NN_<name>_start.png, else the first NN_<name>_*.png.
PREFERRED_STILLS = {
    "la-playground": "playground_sample",
    "la-attention": "attention_start",
    "la-kvcalc": "kvcalc_start",
    "la-stepper": "stepper_finished",  # as created it is empty: show a whole greedy answer, token by token
    "la-serving": "serving_shared",
}
AS_CREATED = ("start", "sample")  # still names that show a widget as its cell creates it


# --------------------------------------------------------------------------- widgets become stills


def _widget_class(output) -> tuple[str | None, str]:
    """(root CSS class `la-...` or None, Python class name) of a widget output, from the repr it saved.

    A course widget's repr names its root class; any other widget's does not, and it gets no still.
    """
    text = output.get("data", {}).get("text/plain", "")
    text = text if isinstance(text, str) else "".join(text)
    ours = ROOT_CLASS.match(text)
    if ours:
        return ours.group(2), ours.group(1)
    name = re.match(r"^\s*(\w+)\(", text)
    return None, name.group(1) if name else "widget"


def find_still(number: str, css_class: str | None, screenshots: Path) -> Path | None:
    if not css_class:
        return None
    short = css_class.removeprefix("la-")
    candidates = []
    if css_class in PREFERRED_STILLS:
        candidates.append(screenshots / f"{number}_{PREFERRED_STILLS[css_class]}.png")
    candidates.append(screenshots / f"{number}_{short}_start.png")
    candidates.extend(sorted(screenshots.glob(f"{number}_{short}_*.png")))
    return next((p for p in candidates if p.is_file()), None)


def _still_output(page: Page, still: str | None, widget: str, css_class: str | None, screenshots: Path) -> dict:
    live = (f"Widgets do not run in a static page: run it live with <code>make lab</code>, "
            f"notebook {page.number} (<code>{html.escape(page.source.name)}</code>).")
    if still:
        state = Path(still).stem.removeprefix(f"{page.number}_{(css_class or '').removeprefix('la-')}_")
        used = "" if state in AS_CREATED else f", after the browser test used it ({state.replace('_', ' ')})"
        body = (f'<figure class="book-still" data-widget="{html.escape(css_class or widget)}">'
                f'<img src="stills/{html.escape(still)}" alt="{html.escape(widget)}, as it renders in JupyterLab">'
                f"<figcaption>A still of the <b>{html.escape(widget)}</b> widget as JupyterLab renders it"
                f"{html.escape(used)} (saved by the browser tests). {live}</figcaption></figure>")
    else:
        expected = (f"{_shown(screenshots)}/{page.number}_{css_class.removeprefix('la-')}_start.png" if css_class
                    else "a still named in tools/site/render.py PREFERRED_STILLS")
        body = (f'<div class="book-still-missing" data-widget="{html.escape(css_class or widget)}">'
                f"&#9888; No still of the <b>{html.escape(widget)}</b> widget: the browser tests did not save "
                f"<code>{html.escape(expected)}</code>. {live}</div>")
    return {"output_type": "display_data", "metadata": {}, "data": {"text/html": body, "text/plain": widget}}


def _still_for(page: Page, index: int, out, screenshots: Path, stills_dir: Path, book: Book):
    """The output that shows widget output `out` of cell `index`: its still, or a note that it is missing."""
    import nbformat

    css_class, widget = _widget_class(out)
    still = find_still(page.number, css_class, screenshots)
    if still:
        stills_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(still, stills_dir / still.name)
        book.stills.append(still.name)
    else:
        book.missing_stills.append(
            f"{_cell_name(page.source, page.nb, index)} shows the {widget} widget ({css_class or 'no la- class'}), "
            f"and no still of it exists in {_shown(screenshots)}/: run the browser tests (`make screenshots` or "
            "`make test`)")
    return nbformat.from_dict(_still_output(page, still.name if still else None, widget, css_class, screenshots))


# --------------------------------------------------------------------------- the pages


def _prepare(page: Page, screenshots: Path, stills_dir: Path, book: Book):
    """A copy of the executed notebook as the book shows it."""
    from nbconvert.preprocessors import TagRemovePreprocessor

    nb = copy.deepcopy(page.nb)
    for index, cell in enumerate(nb.cells):  # before any cell is dropped: the indices are the notebook's
        if cell.cell_type == "markdown":
            # An image from the internet (the Colab badge) becomes its text; the link around it stays.
            text = re.sub(r"!\[([^\]]*)\]\(\s*(?:https?:)?//[^)]*\)", r"\1", _source_text(cell))
            cell.source = re.sub(r"<img\b[^>]*\bsrc\s*=\s*[\"']?(?:https?:)?//[^>]*>", "", text, flags=re.I)
        elif cell.cell_type == "code":
            cell.outputs = [_still_for(page, index, out, screenshots, stills_dir, book)
                            if WIDGET_MIME in out.get("data", {}) else out for out in cell.get("outputs", [])]
    nb, _ = TagRemovePreprocessor(remove_cell_tags={SETUP_TAG}).preprocess(nb, {})
    count = 0  # In [1] is the first cell the page shows
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.get("execution_count"):
            count += 1
            cell.execution_count = count
            for out in cell.outputs:
                if out.get("output_type") == "execute_result":
                    out["execution_count"] = count
    nb.metadata.pop("widgets", None)
    return nb


def _nav(pages: list[Page], current: Page | None) -> str:
    items = ['<a class="book-home" href="index.html">LLM Anatomy</a>']
    if current is not None:
        at = pages.index(current)
        if at > 0:
            items.append(f'<a rel="prev" href="{pages[at - 1].html_name}">&larr; {html.escape(pages[at - 1].title)}</a>')
        items.append('<a href="index.html#contents">Contents</a>')
        if at + 1 < len(pages):
            items.append(f'<a rel="next" href="{pages[at + 1].html_name}">{html.escape(pages[at + 1].title)} &rarr;</a>')
    return '<nav class="book-nav">' + " ".join(items) + "</nav>"


def _when(env: dict) -> str:
    return env.get("executed_at", "?").replace("T", " ").replace("+00:00", " UTC")


def _footer(page: Page) -> str:
    env = page.environment
    ran = (f"executed {_when(env)} on {env.get('device', '?')}"
           + (f", commit {env['commit']}" if env.get("commit") else ""))
    return (f'<footer class="book-footer">This page shows notebook {page.number} '
            f"(<code>notebooks/{html.escape(page.source.name)}</code>) as it ran: {html.escape(ran)}, "
            f"in {page.seconds:.0f} s of cell time. Run it yourself: <code>make lab</code>. "
            f'<a href="index.html">Contents</a></footer>')


def write_static(out: Path) -> None:
    """static/: JupyterLab's light theme and nbconvert's code colours, then the book's own CSS, once for every page."""
    from jupyter_core.paths import jupyter_path
    from jupyterlab_pygments import JupyterStyle
    from pygments.formatters import HtmlFormatter

    for base in jupyter_path("nbconvert", "templates"):
        lab = Path(base) / "lab" / "static"
        if (lab / "index.css").is_file():
            parts = [(lab / name).read_text(encoding="utf-8") for name in ("index.css", "theme-light.css")]
            break
    else:
        raise BuildError("nbconvert's lab template (static/index.css) was not found: pip install nbconvert")
    parts.append(HtmlFormatter(style=JupyterStyle).get_style_defs(".highlight"))
    (out / "static").mkdir(parents=True, exist_ok=True)
    (out / "static" / "lab.css").write_text("\n".join(parts), encoding="utf-8")
    shutil.copyfile(STATIC / "book.css", out / "static" / "book.css")


def render_pages(pages: list[Page], out: Path, screenshots: Path, book: Book) -> None:
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    config = Config()
    config.HTMLExporter.template_name = "lab"
    config.HTMLExporter.template_file = "page.html.j2"
    config.HTMLExporter.extra_template_basedirs = [str(TEMPLATES)]
    config.HTMLExporter.extra_template_paths = [str(TEMPLATES)]
    config.HTMLExporter.exclude_anchor_links = False
    config.HTMLExporter.embed_images = False
    config.ExtractOutputPreprocessor.enabled = True
    config.CSSHTMLHeaderPreprocessor.enabled = False
    exporter = HTMLExporter(config=config)
    for page in pages:
        nb = _prepare(page, screenshots, out / "stills", book)
        nb.metadata["title"] = page.title
        resources = {"unique_key": page.stem, "output_files_dir": f"{page.stem}_files",
                     "book": {"title": page.title, "name": BOOK_NAME, "nav": _nav(pages, page),
                              "footer": _footer(page)}}
        body, resources = exporter.from_notebook_node(nb, resources=resources)
        for name, data in (resources.get("outputs") or {}).items():
            target = out / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data if isinstance(data, bytes) else data.encode())
        (out / page.html_name).write_text(_book_links(body), encoding="utf-8")


# A notebook's markdown links to another notebook by its file name; in the book that is the other page.
_NOTEBOOK_LINK = re.compile(r'href="(?:\.?/)?(\d\d_[a-z0-9_]+)\.ipynb(#[^"]*)?"')


def _book_links(body: str) -> str:
    """Links between notebooks (`08_serving.ipynb`, `./08_serving.ipynb#...`) pointed at their pages in the book."""
    return _NOTEBOOK_LINK.sub(lambda m: f'href="{m.group(1)}.html{m.group(2) or ""}"', body)


# --------------------------------------------------------------------------- the front page


def _inline_markdown(text: str):
    """One of README's table cells as HTML, by nbconvert's Markdown renderer (mistune), without the paragraph."""
    from markupsafe import Markup
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    rendered = markdown2html_mistune(text).strip()
    return Markup(re.sub(r"^<p>(.*)</p>$", r"\1", rendered, flags=re.S))


def render_index(book: Book, contents: dict[str, str], environment: dict) -> None:
    """index.html from templates/index.html.j2: the machine, the contents in course order, the claims' links."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape
    from markupsafe import Markup

    env = environment
    gpu = f", GPU memory {env['gpu_memory_total_gb']} GB" if env.get("gpu_memory_total_gb") else ""
    machine = [
        ("device", env.get("device", "?") + (f" ({env['dtype']})" if env.get("dtype") else "")),
        ("processor", f"{env.get('processor', '?')}, {env.get('cpu_cores', '?')} logical cores, "
                      f"{env.get('ram_total_gb', '?')} GB RAM{gpu}"),
        ("system", f"{env.get('platform', '?')}, Python {env.get('python', '?')}"),
        ("packages", ", ".join(f"{k} {v}" for k, v in (env.get("packages") or {}).items()) or "?"),
        ("model", env.get("default_model", "?")),
        ("executed", _when(env) + (f", commit {env['commit']}" if env.get("commit") else "")),
        ("cell time", f"{sum(p.seconds for p in book.pages):.0f} s for the {len(book.pages)} notebooks"),
    ]
    jinja = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(["html", "j2"]))
    built = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", " UTC")
    page = jinja.get_template("index.html.j2").render(
        name=BOOK_NAME, nav=Markup(_nav(book.pages, None)), machine=machine, built=built,
        runs=len({p.environment.get("executed_at") for p in book.pages}),
        contents=[(p, _inline_markdown(contents[p.source.name]) if contents.get(p.source.name) else "")
                  for p in book.pages],
        claims=[(cid, _inline_markdown(text), links, book.verdicts.get(cid, {})) for cid, text, links in book.claims],
        totals={kind: sum(v.get(kind, 0) for v in book.verdicts.values()) for kind in ("holds", "reading", "not shown")},
        unshown=[cid for cid, v in book.verdicts.items() if v.get("not shown")])
    book.index.write_text(page, encoding="utf-8")
