"""The OpenAI-compatible API: HTTP requests -> engine calls on the shared models -> responses.

`api_routes(...)` gives the routes the app mounts on its own server (GET /v1/models, POST
/v1/chat/completions). Gradio-free: starlette only (which gradio's FastAPI server runs on).
"""

from .routes import API_KEY_ENV, MAX_BODY_BYTES, ApiAccess, access_for, api_routes, is_loopback

__all__ = ["API_KEY_ENV", "MAX_BODY_BYTES", "ApiAccess", "access_for", "api_routes", "is_loopback"]
