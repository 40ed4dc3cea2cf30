"""`python -m llmfleet_gateway ARGS` = `llmfleet-gateway ARGS`."""

from llmfleet_gateway.cli import main

raise SystemExit(main())
