"""The sandbox chat templates render in: Jinja2's ImmutableSandboxedEnvironment, made strict
about attributes and bounded in what one render may build.

A GGUF from a stranger carries its own template, so it is untrusted code. The immutable
sandbox already blocks attribute walks to `__globals__`/`os` and mutation of the messages;
here an unsafe attribute raises at once (instead of rendering as ''), and every way a
template can build something huge from something small is bounded:
  - `*` builds at most MAX_BUILT items or characters, `**` exponents are at most 4096;
  - a string that `~`, `+`, `%`, `str.format`, a str method (ljust, replace, join, ...)
    or a filter builds is at most MAX_STRING characters; sizes that can be known before
    building (padding widths, format widths, replace, join, `~`, `+`) are checked before;
  - range() yields at most MAX_LOOP_ITEMS items over one render (`start_render` resets it);
  - filters take no integer argument above MAX_BUILT (`batch(10**10, x)` would fill a list
    that long); lipsum() is gone (no chat template uses it; lipsum(10**9) is gigabytes).
Each raises SecurityError, which ChatFormatter turns into a ChatTemplateError.
What does not live here: rendering and the template variables (chat_format.py).
"""

from __future__ import annotations

import functools
import re
import string
import threading
from typing import Any

import jinja2
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_BUILT = 1 << 20  # items or characters one `*` may build
MAX_STRING = 1 << 24  # characters of any one string a render builds (a 1M-token chat is ~4 MB of text)
MAX_LOOP_ITEMS = 1_000_000  # range() items over one render
_PADDING = frozenset({"ljust", "rjust", "center", "zfill", "expandtabs"})
_PERCENT_WIDTH = re.compile(r"%[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?")
_budget = threading.local()


def start_render() -> None:
    """Give this thread's next render its whole range() budget."""
    _budget.left = MAX_LOOP_ITEMS


def _budgeted_range(*args: int) -> range:
    r = range(*args)
    left = getattr(_budget, "left", MAX_LOOP_ITEMS) - len(r)
    if left < 0:
        raise SecurityError(f"the template loops over more than {MAX_LOOP_ITEMS} range() items in one render")
    _budget.left = left
    return r


def _check_size(n: int, what: str) -> None:
    if n > MAX_STRING:
        raise SecurityError(f"{what} would build {n} characters (at most {MAX_STRING})")


def _check_built(value: Any, what: str) -> Any:
    if isinstance(value, (str, list, tuple)) and len(value) > MAX_STRING:
        raise SecurityError(f"{what} built {len(value)} items or characters (at most {MAX_STRING})")
    return value


def _check_widths(numbers: list[str], what: str) -> None:
    for n in numbers:
        if n == "*":
            raise SecurityError(f"{what}: widths taken from the arguments ('*') are not allowed")
        if n and int(n) > MAX_STRING:
            _check_size(int(n), what)


def _str_join(parts: tuple) -> str:
    """`a ~ b ~ ...` (Jinja2's str_join), its length checked before it is built."""
    parts = tuple(map(str, parts))
    _check_size(sum(map(len, parts)), "'~'")
    return "".join(parts)


class _BoundedConcat(CodeGenerator):
    """Compiles `~` to the environment's bounded join (Jinja2 has no hook for it)."""

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Any) -> None:
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class StrictSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, strict about attributes and bounded in size (see the module)."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _BoundedConcat

    bounded_concat = staticmethod(_str_join)  # what `~` compiles to (_BoundedConcat)

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_BUILT:
                    raise SecurityError(f"'*' would build {len(seq) * n} items (at most {MAX_BUILT})")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 4096:
                raise SecurityError(f"'**' with exponent {right} (at most 4096)")
        elif operator == "+":
            if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                _check_size(len(left) + len(right), "'+'")
        elif isinstance(left, str):  # '%' formatting
            _check_widths([n for m in _PERCENT_WIDTH.finditer(left) for n in m.groups() if n], "'%'")
        return _check_built(super().call_binop(context, operator, left, right), f"'{operator}'")

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
        if isinstance(owner, str):
            _check_str_method(owner, name, args, kwargs)
        return _check_built(super().call(context, obj, *args, **kwargs), f"calling {name or obj!r}")

    def wrap_str_format(self, value: Any) -> Any:
        """`str.format` as Jinja2 wraps it, once its format string's widths are checked."""
        wrapped = super().wrap_str_format(value)
        if wrapped is not None:
            try:
                specs = [spec for _, _, spec, _ in string.Formatter().parse(value.__self__) if spec]
            except ValueError:  # a malformed format string: format() will say so itself
                specs = []
            if any("{" in spec for spec in specs):
                raise SecurityError("str.format: widths taken from the arguments ('{:{w}}') are not allowed")
            _check_widths([n for spec in specs for n in re.findall(r"\d+", spec)], "str.format")
        return wrapped


def _check_str_method(s: str, name: str, args: tuple, kwargs: dict) -> None:
    """Refuse a str method call whose result would exceed MAX_STRING, before it is built."""
    if name in _PADDING:
        for n in (*args, *kwargs.values()):
            if isinstance(n, int):
                _check_size(n if name != "expandtabs" else n * max(1, s.count("\t")) + len(s), f"str.{name}")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        count = s.count(args[0]) if args[0] else len(s) + 1
        _check_size(len(s) + count * max(0, len(args[1]) - len(args[0])), "str.replace")
    elif name == "join" and args and isinstance(args[0], (list, tuple)):
        items = args[0]
        _check_size(sum(len(x) if isinstance(x, str) else 0 for x in items) + len(s) * max(0, len(items) - 1),
                    "str.join")


def _bounded_filter(f: Any) -> Any:
    """A built-in filter that takes no integer argument above MAX_BUILT and returns nothing
    longer than MAX_STRING (the filter's own Jinja2 markers are kept by functools.wraps)."""
    skip = 2 if getattr(f, "jinja_pass_arg", None) is not None else 1  # (context,) value, *args

    @functools.wraps(f)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        for n in (*args[skip:], *kwargs.values()):
            if isinstance(n, int) and not isinstance(n, bool) and abs(n) > MAX_BUILT:
                raise SecurityError(f"filter {f.__name__!r} given {n} (at most {MAX_BUILT})")
        value = args[skip - 1] if len(args) >= skip else None
        if f.__name__ == "do_join" and isinstance(value, (list, tuple)):
            _check_str_method(str(args[skip]) if len(args) > skip else "", "join", (value,), {})
        return _check_built(f(*args, **kwargs), f"filter {f.__name__!r}")

    return bounded


def make_environment(**options: Any) -> StrictSandbox:
    env = StrictSandbox(**options)
    env.filters = {name: _bounded_filter(f) for name, f in env.filters.items()}
    env.globals.pop("lipsum", None)
    env.globals["range"] = _budgeted_range
    return env
