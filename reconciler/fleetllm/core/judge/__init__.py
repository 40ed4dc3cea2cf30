"""Judging and planning: intended and observed state, verdicts, the LiteLLM plan. Pure."""
