"""`python -m otel_llm ...` is `otel-llm ...`."""

from otel_llm.cli import main

raise SystemExit(main())
