"""Response shapes: the OpenAI objects the routes answer with (every field present),
built from the domain's rows, and their pydantic models (what /openapi.json says each
route returns), one module per resource; ``common`` holds the error, page and deletion
shapes they share."""
