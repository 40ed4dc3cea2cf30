"""`python3 -m fleetllm_installer [--dry-run] [--config-file FILE]`: run the box installer;
`python3 -m fleetllm_installer agent [--once]`: run the box agent."""

import sys

if sys.argv[1:2] == ["agent"]:
    from fleetllm_installer.agent import main as agent_main

    raise SystemExit(agent_main(sys.argv[2:]))
from fleetllm_installer.main import main

raise SystemExit(main())
