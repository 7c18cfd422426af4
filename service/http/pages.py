"""The pages a person opens: the attention explorer at / and Swagger UI at /docs.

Both are served from installed files (the explorer from this package, Swagger UI from the
swagger-ui-bundle-v2 package), so they work without internet.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

EXPLORER = resources.files("attnserve.service.http") / "static" / "explorer"
SWAGGER_ASSETS = "/docs/assets"


def add_pages(app: FastAPI) -> None:
    """Mount the explorer and the API docs on `app` (static files need the app's mounts)."""

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=str(app.openapi_url),
            title="attnserve: API docs",
            swagger_js_url=f"{SWAGGER_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{SWAGGER_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{SWAGGER_ASSETS}/favicon-32x32.png",
        )

    @app.get("/", include_in_schema=False)
    async def explorer() -> FileResponse:
        return FileResponse(str(EXPLORER / "index.html"))

    app.mount(SWAGGER_ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="swagger-ui")
    app.mount("/explorer", StaticFiles(directory=str(EXPLORER)), name="explorer")
