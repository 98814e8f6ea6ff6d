from sentinel.cli import main

raise SystemExit(main())
