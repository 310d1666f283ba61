"""The expression sandbox's allow-list and size estimates (issue 12 item 3, follow-up).

Each attack would build a bit more than the 100,000 cap (a few hundred KB at most, so a
broken guard cannot hurt the test run); each must be refused before it runs.
"""

from __future__ import annotations

import pytest

from flowhook.definition import ExpressionError, compile_value

CTX = {
    "payload": {"n": 3, "items": [1, 2], "name": "Ada", "amount": 12.5, "tags": ["a", "b"]},
    "steps": {"send-email": {"output": {"id": "m1"}, "status": "completed"}},
    "run": {"id": "r1"},
}

# 500 references to one 1,000-character string: 500,000 characters once printed.
SHARED = "(range(500) | map(attribute='zz', default='y' * 1000) | list)"
DEEP = "{% set ns = namespace(a=1) %}{% for i in range(100) %}{% set ns.a = [ns.a] %}{% endfor %}"

ATTACKS = [
    # 1. shared references printed by a filter, uncharged
    *(f"{{{{ {SHARED} | {f} }}}}" for f in ("lower", "upper", "title", "capitalize", "trim")),
    *(f"{{{{ {SHARED} | {f} }}}}" for f in ("e", "escape", "striptags", "wordcount")),
    f"{{{{ {SHARED} | center(10) }}}}",
    f"{{{{ {SHARED} | replace('y', 'z') }}}}",
    f"{{{{ {SHARED} | indent(2) }}}}",
    f"{{{{ {SHARED} | format }}}}",
    "{{ {}.fromkeys(range(500), 'y' * 1000) | string }}",
    # 2. int methods that allocate
    "{{ (1).to_bytes(200000, 'big') }}",
    "{{ (1).to_bytes }}",
    # 3. % specs with nested brackets in the key
    "{{ '%((a)s)200000s' % {'(a)s': 'x'} }}",
    "{{ '%((a)s)200000s' | format(**{'(a)s': 'x'}) }}",
    "{{ ('%(a)s' * 200) % {'a': 'x' * 1000} }}",
    "{{ '%*s' | format(200000, 'x') }}",
    # 4. tojson's indent
    "{{ [[1, [2]]] | tojson(indent=1000) }}",
    "{{ [[1, [2]]] | tojson(indent='x' * 1000) }}",
    DEEP + "{{ ns.a | tojson(indent=16) }}",
    # 5. urlize's target and rel
    "{{ ('http://a.co ' * 100) | urlize(target='t' * 1000) }}",
    "{{ ('http://a.co ' * 100) | urlize(rel='r' * 1000) }}",
    # 6. bytes
    "{{ 'ab'.encode() }}",
    "{{ ('x' * 30000).encode().hex() }}",
    "{{ 'ab'.encode('utf-32').decode('latin-1') }}",
    "{{ 'ab'.maketrans('a', 'b') }}",
    "{{ (1.5).hex() }}",
    "{{ ('x' | attr('encode'))() }}",
    # 7. constant factors
    "{{ '%r' % ('\\x01' * 30000) }}",
    "{{ '%a' % ('é' * 30000) }}",
    "{{ '{0!r}'.format('\\x01' * 30000) }}",
    "{{ {'a': '\"' * 30000} | xmlattr }}",
    "{{ ('\"' * 30000) | e }}",
    "{{ ('é' * 20000) | urlencode }}",
    "{{ ('x' * 2000) | list | map(attribute='upper') | join }}",
    "{{ ([1.2345678901234567e-300] * 5000) | join }}",
    "{{ ('\ufb03' * 40000) | upper }}",
    "{{ ('\ufb03' * 40000).upper() }}",
    "{% set s = ['\\x01' * 30000] %}{{ s }}",
    # one C call that runs long: 10 ** 1,000,000
    "{{ 5 | round(-1000000) }}",
]


@pytest.mark.parametrize("source", ATTACKS)
def test_each_growth_path_is_refused_before_it_runs(source: str) -> None:
    with pytest.raises(ExpressionError, match="refused by the sandbox"):
        compile_value(source)(CTX)


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("{{ 'a'.encode() }}", "str.encode"),
        ("{{ payload.name.translate({}) }}", "str.translate"),
        ("{{ (1).to_bytes(2, 'big') }}", "int.to_bytes"),
        ("{{ {}.fromkeys([1]) }}", "dict.fromkeys"),
        ("{{ payload.tags.pop() }}", "list.pop"),
        ("{{ payload['name']['encode'] }}", "str.encode"),
        ("{{ ['a'] | map(attribute='encode') | list }}", "str.encode"),
    ],
)
def test_methods_not_on_the_list_are_refused_by_name(source: str, name: str) -> None:
    with pytest.raises(ExpressionError, match=rf"{name} is not available in expressions"):
        compile_value(source)(CTX)


def test_filters_and_globals_not_on_the_list_do_not_exist() -> None:
    with pytest.raises(ExpressionError, match="filter 'pprint' is not available in expressions"):
        compile_value("{{ payload | pprint }}")
    with pytest.raises(ExpressionError, match="there is no 'lipsum' here"):
        compile_value("{{ lipsum() }}")(CTX)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ payload.items }}", [1, 2]),
        ("{{ steps['send-email'].output.id }}", "m1"),
        ("{{ payload.missing | default(0) + payload.n }}", 3),
        ("{{ payload.tags | length }}", 2),
        ("{{ '42' | int + (2.6 | round) }}", 45.0),
        ("{{ 2.567 | round(2) }} {{ 1234 | round(-2, 'floor') }}", "2.57 1200.0"),
        ("{{ payload.tags | join(', ') | upper }}", "A, B"),
        ("{{ payload.name.replace('A', 'a').lower() }}", "ada"),
        ("{{ payload.name | replace('d', 'D') | title }}", "Ada"),
        ("{{ payload.tags | tojson }}", '["a", "b"]'),
        ("{{ [1.5, 2] | tojson(indent=2) }}", "[\n  1.5,\n  2\n]"),
        ("{{ [{'a': 1}, {'a': 2}] | selectattr('a', 'gt', 1) | map(attribute='a') | list }}", [2]),
        ("{{ payload['items'] | sum }}", 3),
        ("{{ [3, 1, 2] | sort | first }}", 1),
        ("{{ 'a,b'.split(',') }}", ["a", "b"]),
        ("{{ payload.get('nope', 7) }}", 7),
        ("{{ payload.keys() | list | length }}", 5),
        ("{{ '{:.2f}'.format(payload.amount) }}", "12.50"),
        ("{{ '%.1f%%' % 12.34 }}", "12.3%"),
        ("{{ '%(a)s' % {'a': 1} }}", "1"),
        ("{{ '%-5s|' | format('ab') }}", "ab   |"),
        ("{{ (7).bit_length() + (1.0).is_integer() }}", 4),
        ("{{ 'a<b' | e }}", "a&lt;b"),
        ("{{ {'q': 'a b'} | urlencode }}", "q=a+b"),
        ("{{ 'see http://a.co' | urlize(target='_blank') | length }}", 72),
        ("{{ ' x ' | trim ~ payload.amount }}", "x12.5"),
        ("{{ [1.5, 2.5] | join('-') }}", "1.5-2.5"),
        ("{{ payload.tags | map('upper') | join }}", "AB"),
        ("{{ ('x' * 30000) | upper | length }}", 30000),
        ("{{ [[1], [2]] | tojson(indent=16) | length }}", 144),
    ],
)
def test_ordinary_expressions_still_work(source: str, expected: object) -> None:
    assert compile_value(source)(CTX) == expected
