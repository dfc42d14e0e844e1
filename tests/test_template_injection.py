"""Server-side template injection: 25 hostile chat templates (a GGUF from a stranger carries
its own) are blocked with a ChatTemplateError, or render harmlessly, within a time and memory
bound (llama-cpp-python's CVE-2024-34359 was the first kind: an attribute walk to `os`)."""

from __future__ import annotations

import resource
import time

import pytest

from edgekv.errors import ChatTemplateError
from edgekv.text.chat_format import ChatFormatter

MESSAGES = [{"role": "user", "content": "hi"}]
PAYLOADS = {
    # attribute walks towards __globals__, os, subprocess
    "class mro": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "cycler globals": "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "joiner globals": "{{ joiner.__init__.__globals__ }}",
    "namespace globals": "{{ namespace.__init__.__globals__ }}",
    "lipsum globals": "{{ lipsum.__globals__['os'].system('id') }}",
    "self globals": "{{ self.__init__.__globals__ }}",
    "raise_exception globals": "{{ raise_exception.__globals__ }}",
    "strftime globals": "{{ strftime_now.__globals__['datetime'] }}",
    "message class": "{{ messages.__class__.__base__.__subclasses__() }}",
    "attr filter": "{{ ''|attr('__class__') }}",
    "format escape": "{{ '{0.__class__}'.format('') }}",
    "getitem dunder": "{{ messages['__class__'] }}",
    "loop frame": "{% for m in messages %}{{ loop.__class__.__init__.__globals__ }}{% endfor %}",
    "macro globals": "{% macro f() %}{% endmacro %}{{ f.__globals__ }}",
    "mutating a list": "{% set x = [1] %}{{ x.append(2) }}",
    "mutating a dict": "{{ messages[0].update({'role': 'system'}) }}",
    "config": "{{ config.items() }}",
    "request": "{{ request.environ }}",
    # resource exhaustion
    "string times huge": "{{ 'a' * 10**10 }}",
    "list times huge": "{{ [0] * 10**9 }}",
    "huge power": "{{ 9 ** 999999999 }}",
    "range too long": "{% for i in range(10**9) %}{% endfor %}",
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "macro recursion": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "deep nesting": "{{ " + "(" * 400 + "1" + ")" * 400 + " }}",
}
HARMLESS = {"macro globals"}  # a Macro has no __globals__: renders as nothing


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_hostile_template_is_blocked_within_bounds(name):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    try:
        out = ChatFormatter(PAYLOADS[name]).render(MESSAGES)
        assert name in HARMLESS, f"rendered {out[:80]!r}"
        assert out == ""
    except ChatTemplateError as exc:
        assert name not in HARMLESS and str(exc)
    assert time.perf_counter() - t0 < 2.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 100_000  # KiB


def test_the_count_the_issue_asks_for():
    assert len(PAYLOADS) == 25


def test_budgets_leave_real_templates_alone():
    # a template that loops and repeats within the budgets still renders, render after render
    t = "{% for i in range(1000) %}{{ '-' * 10 }}{% endfor %}{{ 2 ** 10 }}"
    f = ChatFormatter(t)
    for _ in range(3):
        assert f.render(MESSAGES) == "-" * 10_000 + "1024"
