"""The shortcut guard behind `forbidden` and `forbidden_all` (documented in exercises/__init__.py).

While a guard is open, a call of a refused object raises NotYet, whichever name reached it. Three watches:
1. each (owner, "name") attribute is replaced by a refusal (so `module.f(...)` fails before it starts);
2. sys.setprofile sees every call made from Python code: a Python function by its code object (so a copy, an
   alias or a subclass that inherits the method is caught too), a C function by identity, a C method by its
   class and name whatever the instance (`x.softmax(-1)`);
3. for torch targets, a TorchFunctionMode sees them even when C code calls them (`functools.partial`, `map`).
A refused torch function is refused under its ATen names too (torch.ops.aten.scaled_dot_product_attention,
torch._C._nn.cross_entropy_loss); a refused transformers function or class method is refused in every model family
(Mistral's, Qwen's apply_rotary_pos_emb as Llama's: transformers copies them file to file); the checks' own
module-level helpers (their references) are refused to the learner's code; and a guard whose profile hook the
learner's code removed (sys.setprofile(None)) refuses at its end.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import types
from pathlib import Path

from .not_yet import NotYet

_MISSING = object()
_ATEN = {  # a torch function -> the ATen ops (and C functions of the same names) that compute the same thing
    "scaled_dot_product_attention": {"scaled_dot_product_attention", "_scaled_dot_product_attention_math",
                                     "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                                     "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention",
                                     "_scaled_dot_product_fused_attention_overrideable"},
    "rms_norm": {"rms_norm", "_fused_rms_norm"},
    "cross_entropy": {"cross_entropy_loss"},
    "multi_head_attention_forward": {"_native_multi_head_attention"},
    "kl_div": {"kl_div"},
}
_TRANSFORMERS_MODELS = f"{os.sep}transformers{os.sep}models{os.sep}"
_CHECKS = {str(p) for p in Path(__file__).parent.glob("ch*.py")} | {str(Path(__file__).with_name("_tiny.py"))}
_watching: list["forbidden_all"] = []  # the guards now open, innermost last
_previous_profile = None


def _label(obj) -> str:
    """How a learner would write the refused thing: Tensor.softmax, BPETokenizer.train, sampling.top_p_mask."""
    objclass = getattr(obj, "__objclass__", None)
    if objclass is not None:
        return f"{objclass.__name__.removesuffix('Base')}.{obj.__name__}"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
    module = getattr(obj, "__module__", None) or ""
    if "." not in name and module and not isinstance(obj, type):
        name = f"{module.removeprefix('llm_anatomy.').removeprefix('torch._C._')}.{name}"
    return name


def _owner_label(owner) -> str:
    if isinstance(owner, types.ModuleType):
        return owner.__name__.removeprefix("llm_anatomy.")
    return getattr(owner, "__qualname__", getattr(owner, "__name__", repr(owner)))


def _functions(obj):
    """The Python functions behind `obj` (unwrapped through decorators, descriptors, partials and bound methods)."""
    while True:
        if isinstance(obj, (staticmethod, classmethod, types.MethodType)):
            obj = obj.__func__
        elif isinstance(obj, functools.partial):
            obj = obj.func
        elif isinstance(obj, property):
            yield from (f for part in (obj.fget, obj.fset) if part is not None for f in _functions(part))
            return
        else:
            break
    if isinstance(obj, types.FunctionType):
        yield obj
        if getattr(obj, "__wrapped__", None) is not None:
            yield from _functions(obj.__wrapped__)


class forbidden_all:
    """Refuse every target while the learner's code runs: `with forbidden_all([(module, "f"), g], why): ...`.

    targets: (owner, "name") pairs (owner None: skipped) or the callables themselves; a class stands for every
    method it defines. why: what to do instead, shown as "don't call <target> here: <why>". when: optional
    predicate on the arguments of a Python target's call (a dict of its parameters); only the calls it accepts
    are refused (those targets are watched, not replaced).
    """

    def __init__(self, targets, why: str, *, when=None, transformers=()):
        self.why, self.when, self.tried = why, when, None
        self.aten: set[str] = set()  # ATen op names refused with the torch functions that compute them
        # transformers' functions ("repeat_kv") and methods by class suffix ("RMSNorm.forward"), in every family
        self.families: set[str] = set(transformers)
        self.codes: dict = {}  # code object -> label
        self.objects: dict[int, str] = {}  # id of a C function, C method descriptor or Python function -> label
        self.methods: dict[str, list] = {}  # C method name -> [(class, label)]
        self.patches: list = []  # (owner, name, raw value before, label)
        self.keep: list = []  # keeps the watched objects alive, so that their ids stay theirs
        self.torch = False
        for target in targets:
            if isinstance(target, tuple):
                owner, name = target
                if owner is None:
                    continue
                raw = inspect.getattr_static(owner, name)  # a check that names a missing target is a bug: raise
                label = f"{_owner_label(owner)}.{name}"
                self._in_every_family(owner, name)
                self._watch(raw, label)
                if when is None and not isinstance(raw, type):
                    self.patches.append((owner, name, vars(owner).get(name, _MISSING), label))
            else:
                self._watch(target, _label(target))

    def _in_every_family(self, owner, name: str) -> None:
        """A transformers target is refused in every model family: `repeat_kv`, or `RMSNorm.forward` for a class."""
        module = owner.__name__ if isinstance(owner, types.ModuleType) else getattr(owner, "__module__", "")
        if not module.startswith("transformers.models."):
            return
        if isinstance(owner, types.ModuleType):
            self.families.add(name)
        else:
            family = module.split(".")[2].replace("_", "")  # "llama": LlamaRMSNorm -> RMSNorm
            suffix = owner.__name__[len(family):] if owner.__name__.lower().startswith(family) else owner.__name__
            self.families.add(f"{suffix}.{name}")

    def _watch(self, obj, label: str) -> None:
        self.keep.append(obj)
        module = getattr(getattr(obj, "__objclass__", obj), "__module__", "") or ""
        self.torch |= module.split(".")[0] == "torch"
        self.aten |= _ATEN.get(getattr(obj, "__name__", ""), set()) if module.split(".")[0] == "torch" else set()
        if isinstance(obj, type):  # a class: every method it defines
            for name, member in vars(obj).items():
                if isinstance(member, (types.FunctionType, staticmethod, classmethod, property)):
                    self._watch(member, f"{label}.{name}" if name not in ("__init__", "__call__") else label)
            return
        self.objects[id(obj)] = label
        if isinstance(obj, (types.MethodDescriptorType, types.ClassMethodDescriptorType)):
            self.methods.setdefault(obj.__name__, []).append((obj.__objclass__, label))
            return
        functions = list(_functions(obj))
        if not functions and not isinstance(obj, types.BuiltinFunctionType):
            raise TypeError(f"forbidden_all cannot watch {label} ({type(obj).__name__})")
        for function in functions:
            self.codes[function.__code__] = label
            self.objects[id(function)] = label
            self.keep.append(function)

    # ------------------------------------------------------------------ what the watches call

    def refuse(self, label: str):
        self.tried = self.tried or label
        raise NotYet(f"don't call {label} here: {self.why}")

    def _refuses_call(self, arguments) -> bool:
        return self.when is None or bool(self.when(arguments))

    def on_python_call(self, frame) -> None:
        code = frame.f_code
        label = self.codes.get(code)
        if label is not None and self._refuses_call(dict(frame.f_locals)):
            self.refuse(label)
        known = _kinds.get(id(code))
        if known is None or known[0] is not code:  # by identity: equal code objects may live in other files
            known = _kinds[id(code)] = (code, _kind(code))
        kind = known[1]
        if kind == "op" and self.aten:  # torch.ops.aten.<op>(...) or its .default overload
            op = getattr(frame.f_locals.get("self"), "_name", "") or ""
            if op.split("::")[-1].split(".")[0] in self.aten:
                self.refuse(f"torch.ops.{op.replace('::', '.')}")
        elif kind == "transformers" and self.families:
            owner = type(frame.f_locals.get("self", None)).__name__
            for family in self.families:
                suffix, _, method = family.rpartition(".")
                if code.co_name == method and (not suffix or owner.endswith(suffix)):
                    self.refuse(f"transformers' {owner + '.' if suffix else ''}{code.co_name} (in any model family)")
        elif kind == "check" and self.when is None:
            self.refuse(f"the check's own {Path(code.co_filename).stem}.{code.co_name}")

    def on_c_call(self, function) -> None:
        if self.aten and getattr(function, "__name__", None) in self.aten:
            self.refuse(f"torch's {function.__name__}")
        label = self.objects.get(id(function))
        if label is None and self.methods:
            for cls, method_label in self.methods.get(getattr(function, "__name__", None), ()):
                if isinstance(getattr(function, "__self__", None), cls):
                    label = method_label
        if label is not None and self.when is None:
            self.refuse(label)

    def on_torch_function(self, func) -> None:
        if self.aten and getattr(func, "__name__", None) in self.aten:
            self.refuse(f"torch's {func.__name__}")
        label = self.objects.get(id(func))
        if label is not None and self.when is None:
            self.refuse(label)

    # ------------------------------------------------------------------ open and close

    def __enter__(self):
        global _previous_profile
        self.applied = []
        for owner, name, raw, label in self.patches:
            try:
                setattr(owner, name, self._stand_in(label))
            except TypeError:  # a compiled class (tokenizers' Rust types) keeps its attributes: the watches suffice
                continue
            self.applied.append((owner, name, raw))
        if self.torch:
            self.mode = _torch_watch(self)
            self.mode.__enter__()
        if not _watching:
            _previous_profile = sys.getprofile()
        _watching.append(self)
        sys.setprofile(_on_profile_event)
        return self

    def _stand_in(self, label: str):
        def refused(*args, **kwargs):
            self.refuse(label)

        return refused

    def __exit__(self, exc_type, exc, tb):
        hooked = sys.getprofile() is _on_profile_event
        _watching.remove(self)
        sys.setprofile(_on_profile_event if _watching else _previous_profile)
        if self.torch:
            self.mode.__exit__(None, None, None)
        for owner, name, raw in reversed(self.applied):
            if raw is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, raw)
        if self.tried and not isinstance(exc, NotYet):  # the learner's code swallowed or replaced the refusal
            raise NotYet(f"don't call {self.tried} here: {self.why}") from None
        if not hooked and not isinstance(exc, NotYet):
            raise NotYet("your code switched off the check's watch (sys.setprofile): leave the profiler as it is, "
                         f"and {self.why}.") from None
        return False


def forbidden(owner, name: str, why: str, *, when=None) -> forbidden_all:
    """Refuse one target, `owner.name`, while the learner's code runs (see forbidden_all)."""
    return forbidden_all([(owner, name)], why, when=when)


def _on_profile_event(frame, event, arg):
    if event == "call":
        for guard in _watching:
            guard.on_python_call(frame)
    elif event == "c_call":
        for guard in _watching:
            guard.on_c_call(arg)


_kinds: dict = {}  # id(code) -> (code, what the guard looks for in its calls), worked out once per code object


def _kind(code) -> str:
    """"op" for torch.ops' call paths, "transformers" for a model file of transformers, "check" for a check's own
    module-level helper (not a context manager's generator, which resumes inside the guard it opened), else ""."""
    ops = sys.modules.get("torch._ops")
    if ops is not None and code in (ops.OpOverloadPacket.__call__.__code__, ops.OpOverload.__call__.__code__):
        return "op"
    if _TRANSFORMERS_MODELS in code.co_filename:
        return "transformers"
    if code.co_filename in _CHECKS and "." not in code.co_qualname and not code.co_flags & inspect.CO_GENERATOR:
        return "check"
    return ""


def _torch_watch(guard: forbidden_all):
    from torch.overrides import TorchFunctionMode

    class TorchWatch(TorchFunctionMode):
        def __torch_function__(self, func, types_, args=(), kwargs=None):
            guard.on_torch_function(func)
            return func(*args, **(kwargs or {}))

    return TorchWatch()
