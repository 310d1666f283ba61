"""The start form built from an ``input_schema``, and the payload read back from it."""

from __future__ import annotations

from flowhook.web.start_form import FIELD_PREFIX, form_fields, payload_from_form

SCHEMA = {
    "type": "object",
    "required": ["name", "count"],
    "properties": {
        "name": {"type": "string", "title": "Name", "default": "Ana"},
        "email": {"type": "string", "format": "email"},
        "count": {"type": "integer"},
        "ratio": {"type": ["number", "null"]},
        "on": {"type": "boolean", "default": True},
        "size": {"enum": ["s", "m", 3]},
        "pick": {"enum": [None, {"a": 1}]},
        "tags": {"type": "array"},
        "meta": {"type": "object"},
        "odd": True,
    },
}


def posted(**values: str) -> dict[str, list[str]]:
    return {FIELD_PREFIX + k: [v] for k, v in values.items()}


def test_each_property_gets_an_input_of_its_kind() -> None:
    fields = {f.name: f for f in form_fields(SCHEMA)}
    assert list(fields) == list(SCHEMA["properties"])  # type: ignore[call-overload]
    assert (fields["name"].label, fields["name"].required, fields["name"].default) == (
        "Name",
        True,
        "Ana",
    )
    assert fields["email"].input_type == "email" and not fields["email"].required
    kinds = {n: f.kind for n, f in fields.items()}
    assert kinds == {"name": "text", "email": "text", "count": "integer", "ratio": "number",
                     "on": "boolean", "size": "choice", "pick": "choice", "tags": "json",
                     "meta": "json", "odd": "text"}  # fmt: skip
    assert fields["on"].default == "true"
    assert fields["size"].choices == [("s", "s"), ("m", "m"), ("3", 3)]
    assert form_fields({"type": "string"}) == [] and form_fields(None) == []


def test_the_payload_is_typed_and_empty_optional_fields_are_left_out() -> None:
    fields = form_fields(SCHEMA)
    payload, problems, held = payload_from_form(
        fields, posted(name="Bo", count="7", ratio="0.5", on="true", size="3", tags="[1]", email="")
    )
    assert problems == {}
    assert payload == {"name": "Bo", "count": 7, "ratio": 0.5, "on": True, "size": 3, "tags": [1]}
    assert held["count"] == "7" and held["meta"] == ""
    payload, _, _ = payload_from_form(fields, posted(name="x", count="1"))
    assert payload["on"] is False  # an unchecked box is false, not missing
    payload, problems, _ = payload_from_form(fields, posted(pick="null"))
    assert problems == {} and payload["pick"] is None  # null and objects can be chosen too
    payload, _, _ = payload_from_form(fields, posted(pick='{"a": 1}'))
    assert payload["pick"] == {"a": 1}


def test_what_cannot_be_read_is_named_beside_its_field() -> None:
    _, problems, _ = payload_from_form(
        form_fields(SCHEMA),
        posted(count="7.5", ratio="nan", size="xl", tags="[1,", meta="{}"),
    )
    assert problems == {
        "count": "'7.5' is not a whole number",
        "ratio": "'nan' is not a number",
        "size": "'xl' is not one of the choices",
        "tags": "not valid JSON: Expecting value (column 4)",
    }
