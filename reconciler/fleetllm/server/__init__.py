"""The control plane's HTTP server: serves each box its JSON from the last valid commit of the tracked
branch, records every box request, takes box reports, and exposes health, metrics and admin actions."""
