# ruff: noqa: E501  (one schema per line reads best)
"""The fixed schema and prompt sets of ``benchmarks/structured_outputs.py``.

Thirty JSON schemas (nested objects, arrays, enums, numbers with bounds, required and
optional fields, string patterns), each with the prompt that asks for it, and twenty
tool-choice prompts whose right answer (call a tool or answer in text) is known.
"""

from __future__ import annotations

from typing import Any

S = dict[str, Any]


def obj(properties: S, required: list[str] | None = None, **extra: Any) -> S:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
        **extra,
    }


STR = {"type": "string", "maxLength": 40}
SHORT = {"type": "string", "maxLength": 20}

SCHEMAS: list[tuple[str, str, S]] = [
    ("person", "Describe a person named Alice.", obj({"name": STR, "age": {"type": "integer", "minimum": 0, "maximum": 130}})),
    ("city", "Describe the city of Paris.", obj({"name": STR, "country": STR, "population_millions": {"type": "number", "minimum": 0, "maximum": 50}})),
    ("book", "Describe a famous book.", obj({"title": STR, "author": STR, "year": {"type": "integer", "minimum": 1000, "maximum": 2030}})),
    ("color", "Pick a color of the rainbow.", obj({"color": {"enum": ["red", "orange", "yellow", "green", "blue", "indigo", "violet"]}})),
    ("sentiment", "Classify the sentiment of: I love this phone!", obj({"sentiment": {"enum": ["positive", "negative", "neutral"]}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}})),
    ("todo", "Make a short todo list for a Saturday.", obj({"items": {"type": "array", "items": SHORT, "minItems": 1, "maxItems": 5}})),
    ("address", "Write a postal address in London.", obj({"street": STR, "city": SHORT, "postcode": {"type": "string", "pattern": "^[A-Z]{1,2}[0-9][0-9A-Z]? [0-9][A-Z]{2}$"}})),
    ("email", "Give a contact for a support team.", obj({"team": SHORT, "email": {"type": "string", "pattern": "^[a-z]{2,12}@[a-z]{2,12}\\.(com|org|net)$"}})),
    ("date", "When did the first moon landing happen?", obj({"event": STR, "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}})),
    ("recipe", "Give a simple pancake recipe.", obj({"name": SHORT, "ingredients": {"type": "array", "items": obj({"item": SHORT, "grams": {"type": "integer", "minimum": 1, "maximum": 1000}}), "minItems": 1, "maxItems": 4}})),
    ("movie", "Describe a science fiction movie.", obj({"title": STR, "year": {"type": "integer", "minimum": 1900, "maximum": 2030}, "rating": {"type": "number", "minimum": 0, "maximum": 10}, "genre": {"enum": ["sci-fi", "drama", "comedy", "action"]}})),
    ("employee", "Describe an employee of a bakery.", obj({"name": STR, "role": {"enum": ["baker", "cashier", "manager"]}, "manager": {"type": "boolean"}}, ["name", "role"])),
    ("weather", "Report the weather in Rome.", obj({"city": SHORT, "temperature_c": {"type": "number", "minimum": -50, "maximum": 60}, "condition": {"enum": ["sunny", "cloudy", "rain", "snow"]}})),
    ("product", "Describe a laptop for sale.", obj({"name": STR, "price": {"type": "number", "minimum": 0, "maximum": 10000}, "in_stock": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}}, ["name", "price"])),
    ("nested_company", "Describe a small company.", obj({"name": STR, "ceo": obj({"name": STR, "age": {"type": "integer", "minimum": 18, "maximum": 100}}), "address": obj({"city": SHORT, "country": SHORT})})),
    ("point", "Give a point in 2D space.", obj({"x": {"type": "number", "minimum": -100, "maximum": 100}, "y": {"type": "number", "minimum": -100, "maximum": 100}})),
    ("rgb", "Give the RGB values of orange.", obj({"r": {"type": "integer", "minimum": 0, "maximum": 255}, "g": {"type": "integer", "minimum": 0, "maximum": 255}, "b": {"type": "integer", "minimum": 0, "maximum": 255}})),
    ("quiz", "Write a quiz question about France with choices.", obj({"question": STR, "choices": {"type": "array", "items": SHORT, "minItems": 2, "maxItems": 4}, "answer_index": {"type": "integer", "minimum": 0, "maximum": 3}})),
    ("flight", "Describe a flight from Paris to Rome.", obj({"from": {"type": "string", "pattern": "^[A-Z]{3}$"}, "to": {"type": "string", "pattern": "^[A-Z]{3}$"}, "hours": {"type": "number", "minimum": 0, "maximum": 20}})),
    ("version", "What is the latest version of a software package?", obj({"package": SHORT, "version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$"}})),
    ("phone", "Give a phone contact.", obj({"name": SHORT, "phone": {"type": "string", "pattern": "^\\+[0-9]{8,12}$"}})),
    ("review", "Review a restaurant.", obj({"restaurant": STR, "stars": {"type": "integer", "minimum": 1, "maximum": 5}, "comment": {"type": "string", "maxLength": 60}}, ["restaurant", "stars"])),
    ("animal", "Describe an animal.", obj({"species": SHORT, "legs": {"type": "integer", "minimum": 0, "maximum": 100}, "habitat": {"enum": ["land", "sea", "air"]}, "endangered": {"type": "boolean"}})),
    ("planet", "Describe the planet Mars.", obj({"name": SHORT, "moons": {"type": "integer", "minimum": 0, "maximum": 200}, "has_rings": {"type": "boolean"}})),
    ("matrix", "Give a 2x2 matrix of small integers.", obj({"rows": {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 9}, "minItems": 2, "maxItems": 2}, "minItems": 2, "maxItems": 2}})),
    ("event", "Describe a concert.", obj({"artist": STR, "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}, "price": {"type": "number", "minimum": 0, "maximum": 500}, "sold_out": {"type": "boolean"}}, ["artist", "date"])),
    ("team", "Describe a football team with two players.", obj({"team": SHORT, "players": {"type": "array", "items": obj({"name": SHORT, "number": {"type": "integer", "minimum": 1, "maximum": 99}}), "minItems": 2, "maxItems": 2}})),
    ("translation", "Translate hello to French.", obj({"source": SHORT, "target": SHORT, "language": {"enum": ["fr", "de", "es", "it"]}})),
    ("math", "What is 12 plus 30?", obj({"expression": SHORT, "result": {"type": "integer", "minimum": -1000, "maximum": 1000}})),
    ("settings", "Give settings for a dark mode app.", obj({"theme": {"enum": ["dark", "light"]}, "font_size": {"type": "integer", "minimum": 8, "maximum": 32}, "notifications": obj({"email": {"type": "boolean"}, "push": {"type": "boolean"}})}, ["theme", "font_size"])),
]  # fmt: skip

TOOLS: list[S] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": obj({"city": STR}),
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert_currency",
            "description": "Convert an amount of money from one currency to another",
            "parameters": obj(
                {
                    "amount": {"type": "number", "minimum": 0},
                    "from_currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
                    "to_currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
                }
            ),
        },
    },
]

# (prompt, should call a tool)
TOOL_PROMPTS: list[tuple[str, bool]] = [
    ("What is the weather in Paris right now?", True),
    ("Is it raining in London today?", True),
    ("How hot is it in Madrid at the moment?", True),
    ("Tell me the current weather in Tokyo.", True),
    ("What's the temperature in Berlin now?", True),
    ("Convert 100 USD to EUR.", True),
    ("How many yen is 50 dollars?", True),
    ("Change 20 euros into British pounds.", True),
    ("What is 300 GBP in USD?", True),
    ("Convert 75 CAD to USD please.", True),
    ("Write a haiku about the sea.", False),
    ("What is the capital of Italy?", False),
    ("Say hello to my friend Tom.", False),
    ("Explain what a noun is.", False),
    ("Tell me a joke about cats.", False),
    ("What is 2 plus 2?", False),
    ("Who wrote Romeo and Juliet?", False),
    ("Give me a synonym for happy.", False),
    ("Translate 'good morning' to Spanish.", False),
    ("What color is the sky on a clear day?", False),
]
