// Starts Swagger UI on /api/v1/docs (a file, not an inline script: the page's CSP allows none).
"use strict";
window.addEventListener("DOMContentLoaded", () => {
  const root = document.getElementById("swagger-ui");
  window.ui = window.SwaggerUIBundle({
    url: root.dataset.openapi,
    dom_id: "#swagger-ui",
    deepLinking: true,
  });
});
