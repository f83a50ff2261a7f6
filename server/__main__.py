"""`python -m server ...` is `otel-llm ...`."""

if __name__ == "__main__":
    from server.cli import main

    raise SystemExit(main())
