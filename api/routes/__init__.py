"""The HTTP routes, one blueprint per resource: parse, call a use case, respond."""
