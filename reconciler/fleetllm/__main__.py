from fleetllm.cli.main import main

raise SystemExit(main())
