"""Flow definitions: the shared language of the service (which validates them) and the engine
(which runs them)."""

from flowhook.definition.expressions import ExpressionError, Renderer, compile_value, evaluate
from flowhook.definition.schema import FLOW_SCHEMA, STEP_TYPES
from flowhook.definition.secret_refs import SECRET_NAME, is_secret_name, secret_names
from flowhook.definition.validate import ACTIONS, secrets_of, validate_definition

__all__ = [
    "ACTIONS",
    "FLOW_SCHEMA",
    "STEP_TYPES",
    "SECRET_NAME",
    "ExpressionError",
    "Renderer",
    "compile_value",
    "evaluate",
    "is_secret_name",
    "secret_names",
    "secrets_of",
    "validate_definition",
]
