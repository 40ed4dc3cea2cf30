"""`python -m fleetllm_gateway ARGS` = `fleetllm-gateway ARGS`."""

from fleetllm_gateway.cli import main

raise SystemExit(main())
