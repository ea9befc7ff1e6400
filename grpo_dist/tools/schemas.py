"""Tool schemas and tool responses, with verl's class names and fields (``verl.tools.schemas``).

A verl tool file imports these from ``verl.tools.schemas``; here they live in ``grpo_dist.tools.schemas``
under the same names, so such a file moves over with the module name changed. They are pydantic models as
in verl (``model_validate``, ``model_dump`` work the same way).

The OpenAI function-tool form, as a tool config YAML writes it::

    type: function
    function:
      name: get_weather
      description: The current weather of a city
      parameters:
        type: object
        properties:
          city: {type: string, description: the city's name}
          unit: {type: string, enum: [celsius, fahrenheit], description: the temperature unit}
        required: [city]

Property schemas keep fields beyond ``type``/``description``/``enum`` (``items`` of an array, ``nullable``)
so that a schema made from type hints round-trips; ``type`` may also be a list of JSON types.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class OpenAIFunctionPropertySchema(BaseModel):
    """One parameter of a function: its JSON type, description and allowed values."""

    model_config = ConfigDict(extra="allow")

    type: str | list[str]
    description: str | None = None
    enum: list[Any] | None = None


class OpenAIFunctionParametersSchema(BaseModel):
    """The parameters of a function: a JSON object schema."""

    model_config = ConfigDict(extra="allow")

    type: str = "object"
    properties: dict[str, OpenAIFunctionPropertySchema] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)


class OpenAIFunctionSchema(BaseModel):
    """A function the model may call: name, description, parameters."""

    name: str
    description: str = ""
    parameters: OpenAIFunctionParametersSchema = Field(default_factory=OpenAIFunctionParametersSchema)
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """A tool in OpenAI's format (``{"type": "function", "function": {...}}``), what a chat template's
    ``tools=`` takes."""

    type: str = "function"
    function: OpenAIFunctionSchema


class OpenAIFunctionParsedSchema(BaseModel):
    """A tool call as parsed from the model's text: the name and the arguments as a JSON string."""

    name: str
    arguments: str


class OpenAIFunctionCallSchema(BaseModel):
    """A tool call with its arguments decoded."""

    name: str
    arguments: dict[str, Any]

    @staticmethod
    def from_openai_function_parsed_schema(parsed: OpenAIFunctionParsedSchema) -> tuple[OpenAIFunctionCallSchema, bool]:
        """Decode the arguments; ``(call, has_decode_error)``, the arguments empty when they are not a
        JSON object."""
        try:
            arguments = json.loads(parsed.arguments)
        except json.JSONDecodeError:
            return OpenAIFunctionCallSchema(name=parsed.name, arguments={}), True
        if not isinstance(arguments, dict):
            return OpenAIFunctionCallSchema(name=parsed.name, arguments={}), True
        return OpenAIFunctionCallSchema(name=parsed.name, arguments=arguments), False


class OpenAIFunctionToolCall(BaseModel):
    """A tool call in OpenAI's format."""

    id: str
    type: Literal["function"] = "function"
    function: OpenAIFunctionParsedSchema


class ToolResponse(BaseModel):
    """What a tool gives back to the model: text, and images or videos for multimodal models (verl's
    fields). All may be None (an empty response)."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None

    def is_empty(self) -> bool:
        return not self.text and not self.image and not self.video


def schema_errors(exc: Exception) -> str:
    """A pydantic validation error in one line: ``field.path: message; ...``."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    parts = []
    for err in errors():
        where = ".".join(str(p) for p in err.get("loc", ())) or "(top)"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)
