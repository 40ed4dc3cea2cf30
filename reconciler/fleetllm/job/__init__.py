"""The reconciler: observe the fleet, judge every server, converge LiteLLM's deployments.

Pure core: `intended` (what the repository wants, and each server's deployment), `observed` (what a
pass saw), `verdict` (the judge, with hysteresis), `assess` (verdicts for a pass), `plan` (the planner
and its delete valves), `render` (Terraform-style text, JSON), `saved` (saved plans).
Thin I/O: `observe/` (providers, probes, LiteLLM, the observer), `apply`, `store` (state in the
control plane's store), `engine` (one pass), `runner` (a pass as every caller runs it: the lock, the
operator controls, the dry run, the metrics hand-over), `source` (the fleet a pass reads), `loop` (logs,
schedule), `metrics`, `configfile` (the control plane's config).
"""
