"""The reconciler: observe the fleet, judge every server, converge LiteLLM's deployments.

Pure core: `intended` (what the repository wants), `verdict` (the judge), `plan` (the planner),
`render` (plan output). Thin I/O: `observe/` (providers, probes, LiteLLM), `apply`, `store`, `loop`.
"""
