"""The OpenAI translation, pure (no HTTP server: importing it loads no FastAPI), used by the
gateway's routes and the batch runner alike:

- ``schemas``: the request and response bodies (pydantic) and the error body;
- ``fields``: what is done with every field OpenAI-compatible clients send (refused fields,
  accepted at their no-op values only);
- ``errors``: ``ApiError`` and the status and body each failure gets;
- ``requests``: a body as ``enqueue``'s arguments, one mapping per endpoint;
- ``responses``: a result as the response body, one builder per endpoint;
- ``jsonenc``: the JSON encoder of response bodies (orjson when installed).
"""
