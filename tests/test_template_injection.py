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

# Building a huge string from a small one without `*` (the gap issue 16's first run left):
# each would take gigabytes, or more memory than the machine has, if it ran.
GROWTH = {
    "~ doubling in a namespace loop": "{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
                                     "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "~ doubling written out": "{% set a = 'x' * 1000000 %}" + "".join(
        "{% set a = a ~ a %}" for _ in range(12)) + "{{ a|length }}",
    "+ doubling": "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
                  "{% endfor %}{{ ns.s|length }}",
    "list + doubling": "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}"
                       "{% endfor %}{{ ns.l|length }}",
    "format doubling": "{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
                       "{% set ns.s = '{0}{0}'.format(ns.s) %}{% endfor %}{{ ns.s|length }}",
    "% doubling": "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = '%s%s' % (ns.s, ns.s) %}"
                  "{% endfor %}{{ ns.s|length }}",
    "ljust": "{{ 'a'.ljust(10**10)|length }}",
    "center filter": "{{ 'a'|center(10**10)|length }}",
    "format width": "{{ '{:>9999999999}'.format(1)|length }}",
    "% width": "{{ ('%9999999999s' % 1)|length }}",
    "% star width": "{{ ('%*s' % (9999999999, 1))|length }}",
    "replace growth": "{% set a = 'a' * 1000000 %}{{ a.replace('a', a)|length }}",
    "join growth": "{% set a = 'a' * 1000000 %}{{ ([a] * 1000000)|join('')|length }}",
    "str join growth": "{% set a = 'a' * 1000000 %}{{ ''.join([a] * 1000000)|length }}",
    "batch fill": "{{ [1]|batch(10**10, 0)|list|length }}",
    "indent": "{{ 'a\nb'|indent(10**10)|length }}",
    "lipsum": "{{ lipsum(10**9)|length }}",
}


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


@pytest.mark.parametrize("name", sorted(GROWTH))
def test_a_template_cannot_grow_a_string_without_bound(name):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with pytest.raises(ChatTemplateError):
        ChatFormatter(GROWTH[name]).render(MESSAGES)
    assert time.perf_counter() - t0 < 2.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 300_000  # KiB: a few strings of 16 Mi


def test_the_count_the_issue_asks_for():
    assert len(PAYLOADS) == 25


def test_budgets_leave_real_templates_alone():
    # a template that loops and repeats within the budgets still renders, render after render
    t = "{% for i in range(1000) %}{{ '-' * 10 }}{% endfor %}{{ 2 ** 10 }}"
    f = ChatFormatter(t)
    for _ in range(3):
        assert f.render(MESSAGES) == "-" * 10_000 + "1024"
    # a long conversation (4 MB of text) through ~, +, %, format, join, replace and padding
    big = [{"role": "user", "content": "word " * 800_000}]
    t = ("{% set ns = namespace(s='') %}{% for m in messages %}{% set ns.s = ns.s ~ m.content + '|' %}{% endfor %}"
         "{{ ('%s' % ns.s).replace('word', 'w0rd') }}{{ '{:>10}'.format('x') }}{{ [ns.s, 'x']|join(',')|length }}"
         "{{ 'a'.ljust(5) }}{{ 'b'|center(5) }}{{ [1, 2, 3]|batch(2, 0)|list|length }}")
    out = ChatFormatter(t).render(big)
    assert out.startswith("w0rd w0rd") and out.endswith(f"|         x{4_000_003}a      b  2")
