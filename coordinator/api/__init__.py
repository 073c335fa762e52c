"""The HTTP side: handlers, authorization, the route table, OpenAPI, the dashboard."""
