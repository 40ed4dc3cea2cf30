"""Staged rollouts (issue 14): which box is released which revision, pass by pass. Pure.

`model` holds the frozen records (the durable rollout and box releases, a box's config as the rollout
sees it, the step's input and output), `change` says what a box's config change disrupts, `step` is the
one step function a reconcile pass runs, and `waves` simulates a whole rollout for `fleetllm diff`.
"""
