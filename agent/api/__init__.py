"""The agent's HTTP API: the OpenAI wire format over aiohttp."""
