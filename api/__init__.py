"""The HTTP API: Flask views that parse, call a use case and respond. No torch here."""
