"""The editor's text: JSON or YAML read into a definition (no YAML aliases), a problem's
field found on its line, and two versions compared line by line."""

from __future__ import annotations

from flowhook.web.flow_text import as_text, diff_lines, line_of, read_definition

YAML = """name: Invoice run
steps:
  - id: fetch
    type: http
    request:
      method: GET
      url: https://billing.example.com
  - id: total
    type: transform
"""


def test_yaml_and_json_read_the_same_definition() -> None:
    from_yaml, problem = read_definition(YAML, "yaml")
    assert problem is None
    from_json, problem = read_definition(as_text(from_yaml, "json"), "json")
    assert problem is None and from_json == from_yaml
    assert read_definition(as_text(from_yaml, "yaml"), "yaml")[0] == from_yaml


def test_unreadable_text_says_where() -> None:
    _, problem = read_definition('{"name": "x",\n "steps": [,]}', "json")
    assert (
        problem is not None and problem.line == 2 and problem.message.startswith("not valid JSON")
    )
    _, problem = read_definition("name: [unclosed\nsteps: []\n", "yaml")
    assert problem is not None and problem.message.startswith("not valid YAML")
    _, problem = read_definition('{"n": NaN}', "json")
    assert problem is not None and "NaN" in problem.message


def test_yaml_aliases_are_refused() -> None:
    bomb = "a: &a [x, x, x]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\n"
    definition, problem = read_definition(bomb, "yaml")
    assert definition is None and problem is not None
    assert "aliases" in problem.message and problem.line == 2


def test_a_field_is_found_on_its_line_or_its_parents() -> None:
    assert line_of(YAML, "definition.steps[0].request.method") == 6
    assert line_of(YAML, "definition.steps[0].request.headers") == 5  # missing: its parent
    assert line_of(YAML, "definition.steps[1]") == 8
    assert line_of(YAML, "definition.steps[7].id") == 2  # no such step: the list
    assert line_of(YAML, None) is None
    assert line_of("{not yaml: [", "definition.name") is None
    text = as_text(read_definition(YAML, "yaml")[0], "json")
    assert (
        text.splitlines()[line_of(text, "definition.steps[1].type") - 1].strip()
        == '"type": "transform"'
    )  # type: ignore[operator]


def test_the_diff_shows_what_changed_with_line_numbers() -> None:
    old = {"name": "a", "steps": [1, 2]}
    assert diff_lines(old, old) == []
    lines = diff_lines(old, {"name": "b", "steps": [1, 2]})
    changed = [(d.kind, d.text.strip(), d.old, d.new) for d in lines if d.kind in ("add", "del")]
    assert changed == [("del", '"name": "a",', 2, None), ("add", '"name": "b",', None, 2)]
    assert lines[0].kind == "gap"
