"""Flow definitions: the shared language of the service (which validates them) and the engine
(which runs them)."""

from flowhook.definition.expressions import ExpressionError, Renderer, compile_value, evaluate
from flowhook.definition.schema import FLOW_SCHEMA, STEP_TYPES
from flowhook.definition.validate import ACTIONS, validate_definition

__all__ = [
    "ACTIONS",
    "FLOW_SCHEMA",
    "STEP_TYPES",
    "ExpressionError",
    "Renderer",
    "compile_value",
    "evaluate",
    "validate_definition",
]
