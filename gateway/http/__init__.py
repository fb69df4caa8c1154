"""The HTTP layer: the OpenAI-compatible routes and pass-through, the protocol bounds
(header size and time), request ids and trace context, the client's address, the
concurrency limits, and running the app with uvicorn."""
