"""``/docs`` (Swagger UI) and ``/redoc`` from assets bleedwatch serves itself, and the Bearer scheme.

FastAPI's own pages load their JavaScript, CSS, favicon and (ReDoc) fonts from public CDNs,
so on an air-gapped network they stay blank. The assets here come from the pinned
``fastapi-offline`` wheel (MIT; it redistributes Swagger UI, Apache-2.0, and ReDoc, MIT), read
from the installed package and served under ``/docs/assets/``; only its files are used.

Every ``/v1/`` route takes an API key as ``Authorization: Bearer bw_...`` (checked by
``service/auth/gate.py`` before the body is read, not by a FastAPI security dependency), so the
OpenAPI document declares that scheme itself and marks each ``/v1/`` operation with it: the
Authorize button of ``/docs`` and generated clients then know how to authenticate.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs/assets"
SCHEME = "bearer"
SECURITY_SCHEMES: dict[str, Any] = {
    SCHEME: {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key (`bw_...`) from `bleedwatch keys create` or `POST /v1/keys`; its role "
        "(ingest, read, triage, admin) decides which routes answer.",
    }
}


def install(app: FastAPI) -> None:
    """Serve the docs pages and their assets, and declare the Bearer scheme; ``app`` is made with
    ``docs_url=None, redoc_url=None`` so that FastAPI's CDN pages are not there too."""
    app.mount(ASSETS, StaticFiles(directory=str(files("fastapi_offline") / "static")), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} API",
            swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
            oauth2_redirect_url=f"{root}/docs/oauth2-redirect",
            swagger_ui_parameters={"persistAuthorization": True},
        )

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} API",
            redoc_js_url=f"{root}{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS}/favicon.png",
            with_google_fonts=False,
        )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                description=app.description,
                routes=app.routes,
            )
            schema.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
            for path, operations in schema.get("paths", {}).items():
                if path.startswith("/v1/"):
                    for operation in operations.values():
                        operation["security"] = [{SCHEME: []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the document
