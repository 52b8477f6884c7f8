"""`python -m jaxmon`."""

from jaxmon.cli import main

raise SystemExit(main())
