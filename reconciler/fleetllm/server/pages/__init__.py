"""The fleet status pages and their JSON API (docs/status-pages.md, schemas/openapi.yaml).

    GET  /                 the fleet: boxes and their servers, verdicts from the last reconcile pass
    GET  /models           one row per model: availability, serving deployments, minimum context
    GET  /revision         the served commit, the last attempted one, how to see the difference
    GET  /history          the recent reconcile passes with their actions and errors
    GET  /login, POST /login, POST /logout
    POST /approve          add an unknown box to the placement (a git commit; admin, CSRF-protected)
    GET  /api/fleet, /api/models, /api/attention, /api/revision, /api/passes?limit=N
    GET  /api/openapi.yaml the API's OpenAPI 3.1 description

Every page shows the attention strip. Pages need a viewer or admin token (a session cookie after
login); the API takes the same tokens as `Authorization: Bearer` or the session cookie.

Modules: `inputs` (what is read, once per request), `fleetview`, `attention`, `revisionview` (pure
views), `routes` (the blueprint). Login, cookie and CSRF are fleetllm.server.session; who may see
what, fleetllm.server.access.
"""
