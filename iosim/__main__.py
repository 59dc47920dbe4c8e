from iosim.cli import main

raise SystemExit(main())
