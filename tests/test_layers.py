"""The package's plan holds: its folders are layers, imports point one way, and each concept has one home.

Every import statement of every module is read with `ast` (function-level imports included: a lazy
import is still a dependency), so these tests fail the moment someone adds an arrow the wrong way.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lib" / "llm_anatomy"

# The package's folders are the course's stages, ranked from the bottom; a module may import only from its own rank or
# below. Folders, not module names: a new file takes its folder's rank, so nobody keeps a list of names.
GROUND = {"errors", "device", "paths", "claims", "texts"}
RANKS = [("weights",), ("tokens", "model"), ("generate",), ("measure",), ("serve",), ("fast",), ("distributed",),
         ("constrained",), ("server",), ("views",), ("widgets", "exercises"), ("cli", "__main__")]
TOP = len(RANKS) + 1  # the package's own __init__ re-exports from below; nothing inside imports it


def layer_of(module: str) -> int:
    parts = module.split(".")[1:]  # without "llm_anatomy"
    if not parts:
        return TOP
    head = parts[0]
    if head in GROUND:
        assert len(parts) == 1, module
        return 0
    for rank, folders in enumerate(RANKS, start=1):
        if head in folders:
            assert head == "__main__" or (PACKAGE / head).is_dir(), f"{module}: a stage is a folder"
            return rank
    raise AssertionError(f"{module} is in no stage folder: the package root holds only {sorted(GROUND)}")


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path) -> set[str]:
    """The llm_anatomy modules (and top-level outside packages) that `path` imports, anywhere in the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            for alias in node.names:  # "from . import check" imports the module llm_anatomy.cli.check
                found.add(f"{target}.{alias.name}")
    known = modules()
    return {m for m in found if m in known or not m.startswith("llm_anatomy")}


def internal_graph() -> dict[str, set[str]]:
    known = modules()
    graph = {}
    for name, path in known.items():
        graph[name] = {m for m in imports_of(path) if m in known and m != name}  # a submodule importing its parent too
    return graph


def test_every_module_belongs_to_a_layer():
    for name in modules():
        layer_of(name)


def test_imports_point_one_way():
    wrong = []
    for name, targets in internal_graph().items():
        for target in targets:
            if target != "llm_anatomy" and layer_of(target) > layer_of(name):
                wrong.append(f"{name} (layer {layer_of(name)}) imports {target} (layer {layer_of(target)})")
    assert not wrong, "\n".join(wrong)


def test_there_is_no_import_cycle():
    graph = internal_graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else path + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_only_the_command_line_imports_the_command_line():
    for name, path in modules().items():
        if name.startswith("llm_anatomy.cli") or name == "llm_anatomy.__main__":
            continue
        assert not any(m.startswith("llm_anatomy.cli") for m in imports_of(path)), name


def test_only_widgets_import_ipywidgets():
    for name, path in modules().items():
        if name.startswith("llm_anatomy.widgets"):
            continue
        assert "ipywidgets" not in {m.split(".")[0] for m in imports_of(path)}, name


def test_no_posix_only_module_in_the_package():
    """fcntl and resource do not exist on Windows, where many workshop laptops run."""
    for name, path in modules().items():
        assert not {"fcntl", "resource", "termios"} & {m.split(".")[0] for m in imports_of(path)}, name


@pytest.mark.parametrize("notebook", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_no_notebook_imports_the_command_line(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert not re.search(r"llm_anatomy\.cli\b|from llm_anatomy import cli\b", code)


def test_one_clock_and_one_median():
    """Every timing goes through device.timed; every median is statistics.median."""
    for name, path in modules().items():
        text = path.read_text()
        if name != "llm_anatomy.device":
            calls = [line for line in text.splitlines() if "perf_counter" in line and not line.strip().startswith("#")]
            # the load benchmark's child process times its own `import llm_anatomy`, before the package exists
            calls = [c for c in calls if name != "llm_anatomy.cli.bench.load"]
            assert not calls, f"{name} reads the clock itself: use llm_anatomy.device.timed\n" + "\n".join(calls)
        assert not re.search(r"\[\s*len\([^)]*\)\s*//\s*2\s*\]|\[\s*\w+\s*//\s*2\s*\]\s*#\s*the median", text), \
            f"{name} computes a median by hand: use statistics.median"


def test_one_thread_policy():
    """torch's CPU threads are set in one place, device.py (the policy, pinning by hand, torch_threads); the notebooks
    call those, never torch.set_num_threads."""
    for name, path in modules().items():
        if name != "llm_anatomy.device":
            assert "set_num_threads" not in path.read_text(), f"{name} sets torch's threads: use llm_anatomy.device"
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        code = "\n".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code")
        assert "set_num_threads" not in code, f"{notebook.name} sets torch's threads: use llm_anatomy.device"


def test_one_token_label():
    """Whitespace is made visible in one place only (views/labels.py)."""
    for name, path in modules().items():
        if name == "llm_anatomy.views.labels":
            continue
        text = path.read_text()
        drawn = re.findall(r"""\.replace\(\s*["'](?: |\\n|\\t)["']""", text) + re.findall("\u2423|\\\\u2423", text)
        assert not drawn, f"{name} draws whitespace itself ({drawn}): use llm_anatomy.views.labels.token_label"


CODE_LINES = 250  # a file's code, not its prose: docstrings, comments and blank lines are free


def code_lines(text: str) -> int:
    """Lines that hold code: not blank, not only a comment, not part of a docstring (module, class or function)."""
    tree = ast.parse(text)
    prose = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                prose.update(range(first.lineno, first.end_lineno + 1))
    code = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in skip:
            code.update(range(token.start[0], token.end[0] + 1))
    return len(code - prose)


def test_code_lines_leave_out_prose():
    text = '"""Module.\n\nMore."""\n\n# a comment\ndef f(x):\n    """Doc."""\n    return (x +  # why\n            1)\n'
    assert code_lines(text) == 3  # def, return, and the continued line


def test_files_are_short_enough_to_read_at_one_sitting():
    files = list(modules().values()) + sorted((ROOT / "tools").rglob("*.py"))  # the package, and the site builder
    long = {str(path.relative_to(ROOT)): n for path in files if (n := code_lines(path.read_text())) > CODE_LINES}
    assert not long, f"over {CODE_LINES} lines of code (split by concept, or move what is not the file's lesson): {long}"


def test_no_two_test_files_share_a_name():
    # the tests are not packages (pytest's default import mode): two test_x.py in different folders stop collection
    tests = Path(__file__).resolve().parent
    names: dict[str, list[str]] = {}
    for path in tests.rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert not {name: paths for name, paths in names.items() if len(paths) > 1}


# The model's parts, called one after another, are a forward pass. Only these modules may call them: the model itself,
# the one block variant of the ablations (a block without its residual), and the logit lens (the head on the stream).
# A flattened batch, a paged step or a pipeline stage is a cache or a model with parts swapped, not a second loop.
FORWARD_PARTS = {"embed_tokens", "input_layernorm", "self_attn", "post_attention_layernorm", "mlp", "lm_head"}
FORWARD_HOMES = {"llm_anatomy.model.scratch", "llm_anatomy.model.ablations", "llm_anatomy.model.logit_lens"}


def _part_calls(tree) -> list[str]:
    return [node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr in FORWARD_PARTS]


def _pool_reads(tree) -> list[str]:
    """Subscripts `t[blocks, :, slots]`: a paged pool's layer read or written through a block table."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple) and len(node.slice.elts) == 3:
            first, middle, last = node.slice.elts
            whole = isinstance(middle, ast.Slice) and middle.lower is None and middle.upper is None
            if whole and not any(isinstance(e, (ast.Slice, ast.Constant)) for e in (first, last)):  # t[row, :, 0]
                found.append(ast.unparse(node))
    return found


def test_one_forward_pass():
    """serve/flat_step.py, serve/selective.py and distributed/pipeline.py once wrote the layer loop out again."""
    for name, path in modules().items():
        if name in FORWARD_HOMES or name.startswith("llm_anatomy.exercises"):  # a check's mistake models are its own
            continue
        calls = _part_calls(ast.parse(path.read_text()))
        assert not calls, f"{name} calls the model's parts itself ({sorted(set(calls))}): run the model's forward pass"


def test_one_paged_reader():
    """Only paged_kv.py reads or writes a pool through block ids and slots (RaggedPagedView.read and .write);
    paged_attention.py's kernel reads whole blocks where they lie (keys[block, :, :fill])."""
    for name, path in modules().items():
        if name == "llm_anatomy.serve.paged_kv":
            assert len(_pool_reads(ast.parse(path.read_text()))) >= 2, "the reader and the writer"
            continue
        reads = _pool_reads(ast.parse(path.read_text()))
        assert not reads, f"{name} reads the paged pool itself ({reads}): use paged_kv.RaggedPagedView"


def test_the_forward_and_reader_rules_see_a_rewritten_loop():
    loop = ast.parse("for block in model.layers:\n    x = x + block.mlp(block.post_attention_layernorm(x))\n"
                     "keys[write_blocks, :, write_slots] = k\n")
    assert _part_calls(loop) == ["mlp", "post_attention_layernorm"]
    assert _pool_reads(loop) == ["keys[write_blocks, :, write_slots]"]


def test_one_table_of_number_formats():
    """The short names of the number formats map to torch dtypes in device.py only (DTYPES, dtype_named)."""
    for name, path in modules().items():
        if name != "llm_anatomy.device":
            assert not re.search(r"""["']bf16["']\s*:\s*torch\.bfloat16|torch\.bfloat16\s*:\s*["']bf16""",
                                 path.read_text()), f"{name} has its own table of number formats: use device.DTYPES"


def _hand_sized_pools(tree) -> list[str]:
    """Pools sized by hand: a constant added to blocks_for(...), or a pool made (PagedKVPool.for_model) with a number
    of blocks worked out in place from a sum (`(LONG + 64) // 16 + 8`) instead of pool_blocks."""
    def calls(node, name):
        return any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == name
                   for n in ast.walk(node))

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.right, ast.Constant) \
                and calls(node.left, "blocks_for"):
            found.append(ast.unparse(node))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "for_model":
            blocks = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "num_blocks"), None)
            if isinstance(blocks, ast.BinOp) and not calls(blocks, "pool_blocks"):
                found.append(ast.unparse(blocks))
    return found


def _code_cells(notebook: Path):
    for cell in json.loads(notebook.read_text())["cells"]:
        if cell["cell_type"] == "code":
            source = "".join(cell["source"])
            try:
                yield ast.parse(source)
            except SyntaxError:  # a cell with a shell escape: not Python
                continue


def test_one_pool_sizing():
    """A KV pool is sized by serve.block_manager.pool_blocks only (once four modules and notebook 08 each added
    their own spare blocks to blocks_for, or worked the count out in place)."""
    seen = _hand_sized_pools(ast.parse("n = max_batch * blocks_for(max_len, size) + 4\n"
                                       "p = PagedKVPool.for_model(m, num_blocks=(LONG + 64) // 16 + 8, block_size=16)\n"
                                       "q = PagedKVPool.for_model(m, pool_blocks([n] * 2, 16), 16)\n"
                                       "blocks_for(len(p) + 1, 4)\n"))
    assert seen == ["max_batch * blocks_for(max_len, size) + 4", "(LONG + 64) // 16 + 8"]  # the rule sees both
    for name, path in modules().items():
        if name != "llm_anatomy.serve.block_manager":
            found = _hand_sized_pools(ast.parse(path.read_text()))
            assert not found, f"{name} sizes a pool by hand ({found}): use pool_blocks"
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        found = [f for tree in _code_cells(notebook) for f in _hand_sized_pools(tree)]
        assert not found, f"{notebook.name} sizes a pool by hand ({found}): use pool_blocks"


def test_one_bench_model_loader():
    """The model benchmarks load their model through cli.bench.load_bench_model, not load_model or random_llama
    each (the stepper's benchmark drives the widget, which takes the loaded model whole; the load benchmark times
    load_model itself, in a fresh process)."""
    for name, path in modules().items():
        if name.startswith("llm_anatomy.cli.bench.") and name not in {"llm_anatomy.cli.bench.stepper",
                                                                         "llm_anatomy.cli.bench.load"}:
            text = path.read_text()
            assert not re.search(r"\b(load_model|random_llama)\(", text), f"{name} loads its model itself"


def test_the_readme_map_names_each_stages_files():
    # README's contributor map lists, for the root and each stage folder that names its files, exactly the modules
    # the folder holds: a new or moved file must be placed there too (views/, widgets/, exercises/, cli/ name none)
    rows = [line for line in (ROOT / "README.md").read_text().splitlines()
            if re.match(r"\| (root|`\w+/`):", line)]
    assert len(rows) >= 9, "the README's contributor map has lost its rows"
    for row in rows:
        where, files = row.split("|")[1].split(":", 1)
        folder = PACKAGE if where.strip() == "root" else PACKAGE / where.strip(" `/")
        named = set(re.findall(r"`([\w.]+\.py)`", files))
        held = {p.name for p in folder.glob("*.py")} - {"__init__.py", "__main__.py"}
        assert named == held, f"README's map for {where.strip()}: lists {sorted(named - held)} that it does not " \
                              f"hold, lacks {sorted(held - named)}"
